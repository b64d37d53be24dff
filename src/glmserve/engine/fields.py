"""Engine flags that more than one engine reads, declared once: each engine's settings class
(``engine/<name>/settings.py``) takes the ones it uses, so their types, bounds, defaults and
help are the same wherever they appear."""

from __future__ import annotations

import os
from typing import Annotated, Literal

from pydantic import Field, model_validator

from glmserve.engine.settings import PER_MODEL, EngineSettings

Dtype = Annotated[Literal["auto", "float32", "bfloat16", "float16"], Field(
    "auto", description="transformers, vllm: weight dtype; auto: bfloat16/float16 on GPU, float32 on CPU (vllm: "
                        "the model config's).")]
TrustRemoteCode = Annotated[bool, Field(
    False, description="transformers, vllm: allow model code shipped in the model folder (remote-code "
                       "checkpoints).", json_schema_extra=PER_MODEL)]
NThreads = Annotated[int, Field(
    default_factory=lambda: max(1, os.cpu_count() or 1), ge=1, le=1024,
    description="llama_cpp, transformers: CPU threads for generation.")]
MaxNumBatchedTokens = Annotated[int | None, Field(
    None, ge=1, le=1 << 16,
    description="llama_cpp, vllm: tokens per engine step, one per running sequence plus prompt chunks (chunked "
                "prefill).")]
StreamIntervalMs = Annotated[float, Field(
    50, ge=0, le=1000,
    description="llama_cpp, transformers: streamed tokens may wait this long (ms) to go with later ones (not a "
                "reply's first, last): less CPU; 0: none wait.")]
BatchInvariant = Annotated[bool, Field(
    False, description="llama_cpp, vllm: output independent of batching and drafts (llama_cpp: slower prefill, "
                       "one-token steps on one thread).")]


class SpeculativeSettings(EngineSettings):
    """``--speculative ngram|draft|mtp`` and its flags (llama_cpp: ``engine/llama_cpp/speculative/``:
    n-gram drafts, ``draft_model.py`` and ``mtp.py``; vllm: vLLM's ``speculative_config`` of method ``ngram``,
    ``draft_model`` or ``mtp``, from the same numbers)."""

    speculative: Literal["ngram", "draft", "mtp"] | None = Field(
        None, description="llama_cpp, vllm: speculative decoding; ngram: prompt lookup; draft: a smaller model "
                          "(--draft-model); mtp: the model's NextN (MTP) layers.", json_schema_extra=PER_MODEL,
    )
    spec_ngram_min: int = Field(2, ge=1, le=64, description="llama_cpp, vllm, --speculative ngram: shortest n-gram "
                                                            "looked up, in tokens (vLLM's prompt_lookup_min).",
                                json_schema_extra=PER_MODEL)
    spec_ngram_max: int = Field(4, ge=1, le=64, description="llama_cpp, vllm, --speculative ngram: longest n-gram "
                                                            "looked up, in tokens (vLLM's prompt_lookup_max).",
                                json_schema_extra=PER_MODEL)
    spec_draft_max: int = Field(16, ge=1, le=256, description="llama_cpp, vllm, --speculative: most tokens drafted "
                                                              "per sequence and step (vLLM's num_speculative_tokens; "
                                                              "vllm mtp: 1 unless given).", json_schema_extra=PER_MODEL)
    draft_model: str | None = Field(
        None, description="llama_cpp, vllm, --speculative draft: the draft model, same vocabulary (llama_cpp: as "
                          "--model; vllm: a HF folder).", json_schema_extra=PER_MODEL,
    )

    @model_validator(mode="after")
    def _check_speculative(self):
        if self.speculative is None:
            for name in ("spec_ngram_min", "spec_ngram_max", "spec_draft_max", "draft_model"):
                if name in self.model_fields_set:
                    raise ValueError(f"--{name.replace('_', '-')} needs --speculative")
        elif self.speculative != "ngram":
            if self.speculative == "draft" and not self.draft_model:
                raise ValueError("--speculative draft needs --draft-model PATH")
            for name in ("spec_ngram_min", "spec_ngram_max"):
                if name in self.model_fields_set:
                    raise ValueError(f"--{name.replace('_', '-')} is for --speculative ngram, not {self.speculative}")
            if self.speculative == "mtp" and "draft_model" in self.model_fields_set:
                raise ValueError("--draft-model is for --speculative draft, not mtp (the model drafts itself)")
        elif "draft_model" in self.model_fields_set:
            raise ValueError("--draft-model is for --speculative draft")
        elif self.spec_ngram_min > self.spec_ngram_max:
            raise ValueError("--spec-ngram-min is larger than --spec-ngram-max")
        return self
