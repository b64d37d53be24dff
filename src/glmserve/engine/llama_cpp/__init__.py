"""llama.cpp engine (CPU, GGUF) over llama-cpp-python, continuously batched. llama-cpp-python
is imported by ``build``, not by this package."""

from __future__ import annotations

from typing import TYPE_CHECKING

from glmserve.engine import max_num_seqs_in_force
from glmserve.engine.settings import own_fields
from glmserve.engine.base import EngineError
from glmserve.engine.worker import default_max_num_seqs
from glmserve.engine.llama_cpp.settings import (BATCH_INVARIANT_MAX_NUM_BATCHED_TOKENS, DEFAULT_MAX_NUM_BATCHED_TOKENS,
                                                LlamaCppSettings)
from glmserve.models import ModelNotFoundError, resolve_model

if TYPE_CHECKING:
    from glmserve.engine.llama_cpp.config import EngineConfig
    from glmserve.engine.llama_cpp.engine import LlamaCppEngine

# the engine-specific settings this engine reads (any other engine's is an error here)
SETTINGS = own_fields(LlamaCppSettings)


def max_num_batched_tokens(settings: LlamaCppSettings) -> int:
    """The tokens per step in force: ``--max-num-batched-tokens``, else 512, or 63 with
    ``--batch-invariant``. Raises ``EngineError`` for more than 63 with ``--batch-invariant``."""
    if not settings.batch_invariant:
        return settings.max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS
    limit = BATCH_INVARIANT_MAX_NUM_BATCHED_TOKENS
    if (settings.max_num_batched_tokens or 0) > limit:
        raise EngineError(f"--max-num-batched-tokens {settings.max_num_batched_tokens} is over {limit}, where "
                          f"llama.cpp's CPU kernels stop being batch-invariant; with --batch-invariant give at "
                          f"most {limit}")
    return settings.max_num_batched_tokens or limit


def _config(settings: LlamaCppSettings) -> EngineConfig:
    """Raises ``ModelNotFoundError`` for a ``--draft-model`` that resolves to no GGUF file,
    ``EngineError`` for ``--batch-invariant`` with more than 63 tokens per step."""
    from glmserve.engine.llama_cpp.config import EngineConfig
    from glmserve.engine.llama_cpp.speculative import SpeculativeConfig

    return EngineConfig(
        n_ctx=settings.n_ctx,
        n_threads=settings.n_threads,
        max_num_seqs=max_num_seqs_in_force(settings),
        max_num_batched_tokens=max_num_batched_tokens(settings),
        max_queue=settings.max_queue,
        lora=settings.lora_adapters(),
        kv_layout=settings.kv_layout,
        cache_ram=_cache_ram(settings),
        runner=settings.runner,
        batch_invariant=settings.batch_invariant,
        mmproj=settings.mmproj,
        speculative=None if settings.speculative is None else SpeculativeConfig(
            settings.spec_ngram_min, settings.spec_ngram_max, settings.spec_draft_max,
            _draft_model_path(settings.draft_model) if settings.speculative == "draft" else None,
            settings.speculative == "mtp"),
    )


def _cache_ram(settings: LlamaCppSettings) -> int:
    """``--cache-ram`` in force: off with ``--kv-layout unified`` unless given (then
    ``EngineError``: the host prompt cache restores whole split streams)."""
    if settings.kv_layout == "split":
        return settings.cache_ram
    if settings.cache_ram and "cache_ram" in settings.model_fields_set:
        raise EngineError("--cache-ram needs --kv-layout split (it saves and restores a sequence's own KV "
                          "stream); give --cache-ram 0 or drop it with --kv-layout unified")
    return 0


def _draft_model_path(draft_model: str):
    try:
        return resolve_model(draft_model).path
    except ModelNotFoundError as exc:
        raise ModelNotFoundError(f"--draft-model {exc}") from exc


def build(settings: LlamaCppSettings) -> LlamaCppEngine:
    """The engine for ``settings`` (not started). Raises ``ModelNotFoundError``."""
    from glmserve.engine.llama_cpp.engine import LlamaCppEngine

    return LlamaCppEngine(resolve_model(settings.model), _config(settings))


def memory_estimate(settings: LlamaCppSettings) -> int:
    """Bytes the model of ``settings`` takes once loaded: its GGUF file and its KV cache
    (``engine.memory_estimate``). Raises ``ModelNotFoundError``, ``EngineError``."""
    from glmserve.engine.llama_cpp.memory import memory_estimate as estimate

    return estimate(resolve_model(settings.model).path, _config(settings))


__all__ = ["LlamaCppSettings", "DEFAULT_MAX_NUM_BATCHED_TOKENS", "SETTINGS", "build", "default_max_num_seqs", "memory_estimate"]
