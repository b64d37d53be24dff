"""``LlamaCppSettings``: the flags of ``--engine llama_cpp``, composed into ``ServeSettings``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from glmserve.engine.fields import BatchInvariant, MaxNumBatchedTokens, NThreads, SpeculativeSettings

# --max-num-batched-tokens when not set: llama.cpp's default micro-batch (n_ubatch), the prompt
# chunk its CPU backend computes at full speed (llama-server's pace on long prompts)
DEFAULT_MAX_NUM_BATCHED_TOKENS = 512
# --batch-invariant: below 64 tokens a step, llama.cpp's CPU backend computes every batch the same
# way, so a request's output does not depend on what it is batched with
BATCH_INVARIANT_MAX_NUM_BATCHED_TOKENS = 63


class LlamaCppSettings(SpeculativeSettings):
    """llama_cpp engine (the default): GGUF models through llama.cpp, on the CPU."""

    n_threads: NThreads
    max_num_batched_tokens: MaxNumBatchedTokens
    batch_invariant: BatchInvariant
    kv_layout: Literal["split", "unified"] = Field(
        "split", description="llama_cpp: KV cache layout. split: one stream of n_ctx cells per sequence "
        "(max-num-seqs x n-ctx cells; faster decoding of many sequences, as llama-server -np N); unified: "
        "n-ctx cells shared by all sequences (less memory; a request waits or is recomputed when the pool "
        "is full). Either way every request may use the whole n-ctx.",
    )
    runner: Literal["auto", "generate", "pooling"] = Field(
        "auto", description="llama_cpp (vLLM's flag): pooling serves the model for /v1/embeddings only, "
        "without a generation context or KV cache; generate also generates; auto: pooling for a non-causal "
        "GGUF (a BERT-style encoder), else generate.",
    )
    cache_ram: int = Field(
        2048, ge=0, le=1 << 24, description="llama_cpp: host-memory prompt cache in MiB (llama-server's "
        "--cache-ram): a free sequence's KV state is kept in RAM before its cells are reused, and a later "
        "prompt sharing a longer prefix with it restores it instead of recomputing it; least recently used "
        "first out; 0: off. Split KV layout only (off by default with --kv-layout unified).",
    )
