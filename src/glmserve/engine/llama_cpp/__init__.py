"""llama.cpp engine (CPU, GGUF) over llama-cpp-python."""

from __future__ import annotations

from typing import TYPE_CHECKING

from glmserve.engine.llama_cpp.engine import LlamaCppEngine
from glmserve.models import resolve_model

if TYPE_CHECKING:
    from glmserve.settings import ServeSettings


def build(settings: ServeSettings) -> LlamaCppEngine:
    """The engine for ``settings`` (not started). Raises ``ModelNotFoundError``."""
    return LlamaCppEngine(
        resolve_model(settings.model),
        n_ctx=settings.n_ctx,
        n_threads=settings.n_threads,
        n_batch=settings.n_batch,
    )


__all__ = ["LlamaCppEngine", "build"]
