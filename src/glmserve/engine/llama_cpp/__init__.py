"""llama.cpp engine (CPU, GGUF) over llama-cpp-python, continuously batched."""

from __future__ import annotations

from typing import TYPE_CHECKING

from glmserve.engine.llama_cpp.engine import EngineConfig, LlamaCppEngine
from glmserve.models import resolve_model

if TYPE_CHECKING:
    from glmserve.settings import ServeSettings


def build(settings: ServeSettings) -> LlamaCppEngine:
    """The engine for ``settings`` (not started). Raises ``ModelNotFoundError``."""
    return LlamaCppEngine(
        resolve_model(settings.model),
        EngineConfig(
            n_ctx=settings.n_ctx,
            n_threads=settings.n_threads,
            max_num_seqs=settings.max_num_seqs,
            max_num_batched_tokens=settings.max_num_batched_tokens,
            max_queue=settings.max_queue,
            lora=settings.lora_adapters(),
        ),
    )


__all__ = ["EngineConfig", "LlamaCppEngine", "build"]
