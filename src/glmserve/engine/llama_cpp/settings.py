"""``LlamaCppSettings``: the flags of ``--engine llama_cpp``, composed into ``ServeSettings``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator

from glmserve.engine.fields import MaxNumBatchedTokens, NThreads


class LlamaCppSettings(BaseModel):
    """llama_cpp engine (the default): GGUF models through llama.cpp, on the CPU."""

    n_threads: NThreads
    max_num_batched_tokens: MaxNumBatchedTokens
    kv_layout: Literal["split", "unified"] = Field(
        "split", description="llama_cpp: KV cache layout. split: one stream of n_ctx cells per sequence "
        "(max-num-seqs x n-ctx cells; faster decoding of many sequences, as llama-server -np N); unified: "
        "n-ctx cells shared by all sequences (less memory; a request waits or is recomputed when the pool "
        "is full). Either way every request may use the whole n-ctx.",
    )
    speculative: Literal["ngram"] | None = Field(
        None, description="llama_cpp: speculative decoding. ngram: prompt lookup, each decoding sequence drafts "
        "the tokens that followed the latest earlier occurrence of its last n tokens (prompt and output so far), "
        "and one batch verifies every draft; the output is the same as without it (greedy: token for token). "
        "Helps input-grounded work (edit this code, repeat this JSON); natural text drafts little.",
    )
    spec_ngram_min: int = Field(2, ge=1, le=64, description="llama_cpp --speculative ngram: shortest n-gram "
                                "looked up (tokens).")
    spec_ngram_max: int = Field(4, ge=1, le=64, description="llama_cpp --speculative ngram: longest n-gram "
                                "looked up (tokens); the longest match wins.")
    spec_draft_max: int = Field(16, ge=1, le=256, description="llama_cpp --speculative ngram: most tokens "
                                "drafted per sequence and step (drafts also fit within --max-num-batched-tokens).")

    @model_validator(mode="after")
    def _check_speculative(self):
        if self.speculative is None:
            for name in ("spec_ngram_min", "spec_ngram_max", "spec_draft_max"):
                if name in self.model_fields_set:
                    raise ValueError(f"--{name.replace('_', '-')} needs --speculative ngram")
        elif self.spec_ngram_min > self.spec_ngram_max:
            raise ValueError("--spec-ngram-min is larger than --spec-ngram-max")
        return self
