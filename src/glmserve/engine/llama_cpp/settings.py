"""``LlamaCppSettings``: the flags of ``--engine llama_cpp``, composed into ``ServeSettings``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from glmserve.engine.fields import BatchInvariant, MaxNumBatchedTokens, NThreads, SpeculativeSettings
from glmserve.engine.settings import PER_MODEL

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
    spec_ngram_cost: Literal["measured", "prior"] = Field(
        "measured", description="llama_cpp, --speculative ngram, for tests: draft row cost learned, or fixed at "
                                "the prior so that drafts follow the tokens alone.",
        json_schema_extra=PER_MODEL,
    )
    kv_layout: Literal["split", "unified"] = Field(
        "split", description="llama_cpp: KV cache layout; split: n_ctx cells per sequence; unified: n_ctx cells "
                             "shared by all (less memory).",
    )
    runner: Literal["auto", "generate", "pooling"] = Field(
        "auto", description="llama_cpp: pooling serves /v1/embeddings only (no generation context); auto: pooling "
                            "for a non-causal GGUF.",
        json_schema_extra=PER_MODEL,
    )
    mmproj: str | None = Field(
        None, description="llama_cpp: image input through this projector GGUF (vision encoder), as llama-server's "
                          "--mmproj; none: text only.",
        json_schema_extra=PER_MODEL,
    )
    cache_ram: int = Field(
        2048, ge=0, le=1 << 24, description="llama_cpp: host-memory prompt cache in MiB, as llama-server's "
                                            "--cache-ram (0: off; split KV layout only).",
    )

    @model_validator(mode="after")
    def _check_spec_ngram_cost(self):
        if "spec_ngram_cost" in self.model_fields_set and self.speculative != "ngram":
            raise ValueError("--spec-ngram-cost is for --speculative ngram")
        return self
