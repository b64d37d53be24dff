"""The ``llama_cpp`` engine's configuration (``EngineConfig``), as ``engine/llama_cpp/__init__.py``
builds it from the settings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from glmserve.engine.llama_cpp.settings import DEFAULT_MAX_NUM_BATCHED_TOKENS
from glmserve.engine.llama_cpp.speculative import SpeculativeConfig
from glmserve.engine.llama_cpp.scheduler import KVLayout
from glmserve.engine.worker import DEFAULT_MAX_NUM_SEQS


@dataclass(slots=True)
class EngineConfig:
    n_ctx: int = 4096  # 0: the model's training context
    n_threads: int = 1
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    max_queue: int | None = None  # None: 8 x max_num_seqs (admission.queue_limit)
    lora: dict | None = None  # adapter name -> GGUF LoRA file
    kv_layout: KVLayout = "split"
    cache_ram: int = 0  # host prompt cache, MiB (0: none; split layout only)
    speculative: SpeculativeConfig | None = None  # --speculative ngram|draft|mtp
    runner: Literal["auto", "generate", "pooling"] = "auto"  # pooling: embeddings only, no generation context
    batch_invariant: bool = False  # --batch-invariant (context_params)
    mmproj: str | None = None  # --mmproj: a projector GGUF, "none", or None: the mmproj-*.gguf beside the model


def context_params(config: EngineConfig, cells: int):
    """llama.cpp's context parameters for ``config``, ``cells`` KV cells in all.

    ``batch_invariant``: each row's logits must not depend on the batch it is computed in (with
    other sequences, or as a verify step's row among a draft's). Steps stay under 64 tokens
    (``max_num_batched_tokens``; llama.cpp's CPU attention tiles 64 query rows together), flash
    attention is on (it computes query rows one by one; without it, a verify step's rows differed
    from one-token steps by up to 1.1 in the logits), and steps of one token run on one thread:
    from 512 KV cells on, llama.cpp's CPU attention splits a lone query row's KV range over the
    threads and reduces the parts, so with two threads the same row differed from its value among
    others by up to 1.1 (``tests/e2e/test_speculative.py``). Larger steps keep ``n_threads``
    (llama.cpp's ``n_threads_batch``)."""
    import llama_cpp

    params = llama_cpp.llama_context_default_params()
    params.n_ctx = cells  # split: llama.cpp gives each of the n_seq_max streams n_ctx / n_seq_max cells
    params.n_batch = config.max_num_batched_tokens
    params.n_ubatch = min(config.max_num_batched_tokens, 512)
    params.n_seq_max = config.max_num_seqs
    params.n_threads = 1 if config.batch_invariant else config.n_threads
    params.n_threads_batch = config.n_threads
    params.kv_unified = config.kv_layout == "unified"
    params.no_perf = True
    if config.batch_invariant:
        params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
    return params
