"""llama.cpp engine (CPU, GGUF) over llama-cpp-python, continuously batched. llama-cpp-python
is imported by ``build``, not by this package."""

from __future__ import annotations

from typing import TYPE_CHECKING

from glmserve.engine.settings import own_fields
from glmserve.engine.worker import default_max_num_seqs
from glmserve.engine.llama_cpp.params import in_force, max_num_batched_tokens, speculative_config
from glmserve.engine.llama_cpp.settings import DEFAULT_MAX_NUM_BATCHED_TOKENS, LlamaCppSettings
from glmserve.models import resolve_model

if TYPE_CHECKING:
    from glmserve.engine.llama_cpp.engine import LlamaCppEngine

# the settings class ``build`` (and ``memory_estimate``) takes: an engine sees these fields only
SETTINGS_CLASS = LlamaCppSettings
# the engine-specific settings this engine reads (any other engine's is an error here)
SETTINGS = own_fields(LlamaCppSettings)


def build(settings: LlamaCppSettings) -> LlamaCppEngine:
    """The engine for ``settings`` (not started). Raises ``ModelNotFoundError``, ``EngineError``
    (``in_force``)."""
    from glmserve.engine.llama_cpp.engine import LlamaCppEngine

    return LlamaCppEngine(resolve_model(settings.model), settings)


def memory_estimate(settings: LlamaCppSettings) -> int:
    """Bytes the model of ``settings`` takes once loaded: its GGUF file and its KV cache
    (``engine.memory_estimate``). Raises ``ModelNotFoundError``, ``EngineError``."""
    from glmserve.engine.llama_cpp.loading.memory import memory_estimate as estimate

    return estimate(resolve_model(settings.model).path, in_force(settings), speculative_config(settings))


__all__ = ["LlamaCppSettings", "DEFAULT_MAX_NUM_BATCHED_TOKENS", "SETTINGS", "SETTINGS_CLASS", "build", "default_max_num_seqs",
           "in_force", "max_num_batched_tokens", "memory_estimate", "speculative_config"]
