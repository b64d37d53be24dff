"""llama.cpp engine (CPU, GGUF) over llama-cpp-python, continuously batched. llama-cpp-python
is imported by ``build``, not by this package."""

from __future__ import annotations

from typing import TYPE_CHECKING

from glmserve.engine import max_num_seqs_in_force
from glmserve.engine.worker import default_max_num_seqs
from glmserve.engine.llama_cpp.settings import LlamaCppSettings
from glmserve.models import ModelNotFoundError, resolve_model

if TYPE_CHECKING:
    from glmserve.engine.llama_cpp.engine import EngineConfig, LlamaCppEngine
    from glmserve.settings import ServeSettings

# the engine-specific settings this engine reads (any other engine's is an error here)
SETTINGS = frozenset(LlamaCppSettings.model_fields)
# --max-num-batched-tokens when not set: below 64, llama.cpp's CPU backend computes every batch
# the same way, so a request's output does not depend on what it is batched with
DEFAULT_MAX_NUM_BATCHED_TOKENS = 63


def _config(settings: ServeSettings) -> EngineConfig:
    """Raises ``ModelNotFoundError`` for a ``--draft-model`` that resolves to no GGUF file."""
    from glmserve.engine.llama_cpp.engine import EngineConfig
    from glmserve.engine.llama_cpp.speculative import SpeculativeConfig

    return EngineConfig(
        n_ctx=settings.n_ctx,
        n_threads=settings.n_threads,
        max_num_seqs=max_num_seqs_in_force(settings),
        max_num_batched_tokens=settings.max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS,
        max_queue=settings.max_queue,
        lora=settings.lora_adapters(),
        kv_layout=settings.kv_layout,
        speculative=None if settings.speculative is None else SpeculativeConfig(
            settings.spec_ngram_min, settings.spec_ngram_max, settings.spec_draft_max,
            _draft_model_path(settings.draft_model) if settings.speculative == "draft" else None),
    )


def _draft_model_path(draft_model: str):
    try:
        return resolve_model(draft_model).path
    except ModelNotFoundError as exc:
        raise ModelNotFoundError(f"--draft-model {exc}") from exc


def build(settings: ServeSettings) -> LlamaCppEngine:
    """The engine for ``settings`` (not started). Raises ``ModelNotFoundError``."""
    from glmserve.engine.llama_cpp.engine import LlamaCppEngine

    return LlamaCppEngine(resolve_model(settings.model), _config(settings))


def memory_estimate(settings: ServeSettings) -> int:
    """Bytes the model of ``settings`` takes once loaded: its GGUF file and its KV cache
    (``engine.memory_estimate``). Raises ``ModelNotFoundError``, ``EngineError``."""
    from glmserve.engine.llama_cpp.engine import memory_estimate as estimate

    return estimate(resolve_model(settings.model).path, _config(settings))


__all__ = ["LlamaCppSettings", "DEFAULT_MAX_NUM_BATCHED_TOKENS", "SETTINGS", "build", "default_max_num_seqs", "memory_estimate"]
