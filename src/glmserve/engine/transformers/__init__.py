"""Hugging Face ``transformers`` engine (CPU or GPU): model folders and GGUF files, PEFT LoRA
adapters per request, image input for vision-language models. Needs the ``transformers`` extra
(torch, transformers, peft); torch is imported by ``build``, not by this package."""

from __future__ import annotations

from typing import TYPE_CHECKING

from glmserve.engine.settings import own_fields
from glmserve.engine.worker import default_max_num_seqs
from glmserve.engine.transformers.settings import TransformersSettings
from glmserve.models import resolve_hf_model

if TYPE_CHECKING:
    from glmserve.engine.transformers.engine import TransformersEngine

# the settings class ``build`` (and ``memory_estimate``) takes: an engine sees these fields only
SETTINGS_CLASS = TransformersSettings
# the engine-specific settings this engine reads (any other engine's is an error here)
SETTINGS = own_fields(TransformersSettings)


def build(settings: TransformersSettings) -> TransformersEngine:
    """The engine for ``settings`` (not started). Raises ``ModelNotFoundError``, or
    ``ImportError`` without the extra."""
    from glmserve.engine.transformers.engine import TransformersEngine

    return TransformersEngine(resolve_hf_model(settings.model), settings)


__all__ = ["TransformersSettings", "SETTINGS", "SETTINGS_CLASS", "build", "default_max_num_seqs"]
