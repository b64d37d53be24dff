"""Engine flags that more than one engine reads, declared once: each engine's settings class
(``engine/<name>/settings.py``) takes the ones it uses, so their types, bounds, defaults and
help are the same wherever they appear."""

from __future__ import annotations

import os
from typing import Annotated, Literal

from pydantic import Field

Dtype = Annotated[Literal["auto", "float32", "bfloat16", "float16"], Field(
    "auto", description="transformers, vllm: weight dtype; auto = bfloat16/float16 on GPU, float32 on CPU "
    "(vllm: the model config's dtype).")]
TrustRemoteCode = Annotated[bool, Field(
    False, description="transformers, vllm: allow model code from the model folder (remote-code checkpoints).")]
NThreads = Annotated[int, Field(
    default_factory=lambda: max(1, os.cpu_count() or 1), ge=1, le=1024,
    description="llama_cpp, transformers: CPU threads for generation.")]
MaxNumBatchedTokens = Annotated[int | None, Field(
    None, ge=1, le=1 << 16,
    description="llama_cpp, vllm: tokens per engine step: one per running sequence plus prompt chunks "
    "(chunked prefill). llama_cpp: default 63; below 64, llama.cpp's CPU backend computes every batch the "
    "same way, so a request's output does not depend on what it is batched with. vllm: default vLLM's "
    "own (2048 on most GPUs, 8192 on H100/H200-class ones).")]
