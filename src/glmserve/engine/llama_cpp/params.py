"""What the ``llama_cpp`` engine runs with, from its settings: ``max_num_seqs``,
``max_num_batched_tokens`` and ``cache_ram`` in force (``in_force``), ``--speculative`` with its
draft model resolved (``speculative_config``), and llama.cpp's context parameters
(``context_params``), and the settings a KV plan leaves in force (``with_kv_plan``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from glmserve.engine import max_num_seqs_in_force
from glmserve.engine.base import EngineError
from glmserve.engine.llama_cpp.settings import (BATCH_INVARIANT_MAX_NUM_BATCHED_TOKENS, DEFAULT_MAX_NUM_BATCHED_TOKENS,
                                                LlamaCppSettings)
from glmserve.models import ModelNotFoundError, resolve_model


if TYPE_CHECKING:
    from glmserve.engine.llama_cpp.loading.memory import KVPlan
    from glmserve.engine.llama_cpp.speculative import SpeculativeConfig


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


def in_force(settings: LlamaCppSettings) -> LlamaCppSettings:
    """``settings`` with the values the engine runs with filled in: ``max_num_seqs`` (the
    engine's default when unset), ``max_num_batched_tokens`` (``max_num_batched_tokens``) and
    ``cache_ram`` (0 with ``--kv-layout unified``; with ``auto``, decided by ``with_kv_plan`` at
    start). Raises ``EngineError`` for ``--batch-invariant`` with more than 63 tokens per step, or
    ``--cache-ram`` with ``--kv-layout unified``."""
    update = {"max_num_seqs": max_num_seqs_in_force(settings), "max_num_batched_tokens": max_num_batched_tokens(settings)}
    if settings.kv_layout != "auto":  # auto's is decided at start, where cache_ram must still say whether it was given
        update["cache_ram"] = _cache_ram(settings)
    return settings.model_copy(update=update)


def speculative_config(settings: LlamaCppSettings) -> SpeculativeConfig | None:
    """``--speculative`` and its ``--spec-*`` flags, the draft model resolved to its GGUF file;
    None without ``--speculative``. Raises ``ModelNotFoundError`` for a ``--draft-model`` that
    resolves to no GGUF file."""
    from glmserve.engine.llama_cpp.speculative import SpeculativeConfig

    if settings.speculative is None:
        return None
    return SpeculativeConfig(settings.spec_ngram_min, settings.spec_ngram_max, settings.spec_draft_max,
                             _draft_model_path(settings.draft_model) if settings.speculative == "draft" else None,
                             settings.speculative == "mtp")


def with_kv_plan(settings: LlamaCppSettings, plan: KVPlan) -> LlamaCppSettings:
    """``settings`` (in force) as the engine runs them with ``plan``: its layout and ``n_ctx``, and
    ``cache_ram`` for that layout (the engine logs the plan's choice once the context is made).
    Raises ``EngineError`` for a ``--cache-ram`` given where ``auto`` chose unified."""
    settings = settings.model_copy(update={"kv_layout": plan.kv_layout, "n_ctx": plan.n_ctx})
    try:
        return settings.model_copy(update={"cache_ram": _cache_ram(settings)})
    except EngineError as exc:
        raise EngineError("; ".join(filter(None, [plan.choice, str(exc)]))) from exc


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


def context_params(settings: LlamaCppSettings, cells: int):
    """llama.cpp's context parameters for ``settings`` (in force: ``max_num_seqs`` and
    ``max_num_batched_tokens`` set, ``kv_layout`` split or unified), ``cells`` KV cells in all, K and
    V of ``--cache-type-k/-v``.

    ``batch_invariant``: each row's logits must not depend on the batch it is computed in (with
    other sequences, or as a verify step's row among a draft's). Steps stay under 64 tokens
    (``max_num_batched_tokens``; llama.cpp's CPU attention tiles 64 query rows together), flash
    attention is on (it computes query rows one by one; without it, a verify step's rows differed
    from one-token steps by up to 1.1 in the logits), and steps of one token run on one thread:
    from 512 KV cells on, llama.cpp's CPU attention splits a lone query row's KV range over the
    threads and reduces the parts, so with two threads the same row differed from its value among
    others by up to 1.1 (``tests/e2e/test_speculative.py``). Larger steps keep ``n_threads``
    (llama.cpp's ``n_threads_batch``).

    Without ``--speculative`` a step asks for one row of logits per sequence, so llama.cpp's
    ``n_outputs_max`` is ``max_num_seqs`` (as llama-server sets it to its slots): llama.cpp then
    reserves its compute buffer for that many rows of the vocabulary, not ``n_batch`` of them
    (96 MiB for SmolLM2 at 512, on the device that holds the output layer)."""
    import llama_cpp

    from glmserve.engine.llama_cpp.loading.memory import CACHE_GGML_TYPES

    params = llama_cpp.llama_context_default_params()
    params.n_ctx = cells  # split: llama.cpp gives each of the n_seq_max streams n_ctx / n_seq_max cells
    params.n_batch = settings.max_num_batched_tokens
    params.n_ubatch = min(settings.max_num_batched_tokens, 512)
    params.n_seq_max = settings.max_num_seqs
    params.n_threads = 1 if settings.batch_invariant else settings.n_threads
    params.n_threads_batch = settings.n_threads
    params.kv_unified = settings.kv_layout == "unified"
    params.type_k, params.type_v = CACHE_GGML_TYPES[settings.cache_type_k], CACHE_GGML_TYPES[settings.cache_type_v]
    params.no_perf = True
    if settings.speculative is None:  # one row of logits per sequence a step; drafts need one per token
        params.n_outputs_max = settings.max_num_seqs
    if settings.batch_invariant:
        params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
    return params
