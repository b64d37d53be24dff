"""``LlamaCppSettings``: the flags of ``--engine llama_cpp``, composed into ``ServeSettings``."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import NoDecode  # a list flag's variable is read as on the command line (3,1)

from glmserve.engine.fields import BatchInvariant, MaxNumBatchedTokens, NThreads, SpeculativeSettings, StreamIntervalMs
from glmserve.engine.settings import PER_MODEL

# --max-num-batched-tokens when not set: llama.cpp's default micro-batch (n_ubatch), the prompt
# chunk its CPU backend computes at full speed (llama-server's pace on long prompts)
DEFAULT_MAX_NUM_BATCHED_TOKENS = 512
# KV cache element types, as llama-server's --cache-type-k/-v accept them (ggml's type names)
CacheType = Literal["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"]
# --batch-invariant: below 64 tokens a step, llama.cpp's CPU backend computes every batch the same
# way, so a request's output does not depend on what it is batched with
BATCH_INVARIANT_MAX_NUM_BATCHED_TOKENS = 63


class LlamaCppSettings(SpeculativeSettings):
    """llama_cpp engine (the default): GGUF models through llama.cpp, on the CPU and the GPUs of
    its build (CUDA, Metal, Vulkan) and of ``--rpc`` servers."""

    n_threads: NThreads
    max_num_batched_tokens: MaxNumBatchedTokens
    batch_invariant: BatchInvariant
    stream_interval_ms: StreamIntervalMs
    spec_ngram_cost: Literal["measured", "prior"] = Field(
        "measured", description="llama_cpp, --speculative ngram, for tests: draft row cost learned, or fixed at "
                                "the prior so that drafts follow the tokens alone.",
        json_schema_extra=PER_MODEL,
    )
    kv_layout: Literal["auto", "split", "unified"] = Field(
        "auto", description="llama_cpp: KV cache layout; split: n_ctx cells per sequence; unified: n_ctx shared; "
                            "auto: split unless over 1/4 of memory the weights leave.",
    )
    cache_type_k: CacheType = Field(
        "f16", description="llama_cpp: KV cache type of K, as llama-server's --cache-type-k (q8_0, q4_0 ...: less "
                           "memory).",
    )
    cache_type_v: CacheType = Field(
        "f16", description="llama_cpp: KV cache type of V, as llama-server's --cache-type-v (a quantized V needs "
                           "llama.cpp's flash attention).",
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
    n_gpu_layers: int | Literal["auto", "all"] = Field(
        "auto", description="llama_cpp: layers in GPU memory, as llama-server's: N, auto (what fits the GPUs' free "
                            "memory) or all; a CPU build offloads none.",
    )
    n_gpu_layers_draft: int | Literal["auto", "all"] = Field(
        "auto", description="llama_cpp, --speculative draft: the draft model's layers in GPU memory (llama-server's "
                            "-ngld); auto: all if all the model's are.",
    )
    split_mode: Literal["none", "layer", "row"] = Field(
        "layer", description="llama_cpp: how layers go over several GPUs, as llama-server's --split-mode.",
    )
    tensor_split: Annotated[list[float], NoDecode] = Field(
        [], description="llama_cpp: the share of each GPU, as llama-server's --tensor-split (e.g. 3,1).",
    )
    main_gpu: int = Field(
        0, ge=0, le=255, description="llama_cpp: the GPU for the whole model with --split-mode none.",
    )
    cpu_moe: bool = Field(
        False, description="llama_cpp: keep every layer's MoE expert tensors in host memory (llama-server's --cpu-moe).",
    )
    n_cpu_moe: int | None = Field(
        None, ge=0, le=10000, description="llama_cpp: keep the MoE expert tensors of the first N layers in host memory.",
    )
    override_tensor: list[str] = Field(
        [], description="llama_cpp: PATTERN=BUFFER: tensors matching the regex go to that buffer type (e.g. CPU); "
                        "repeatable.",
        json_schema_extra=PER_MODEL,
    )
    fit: Literal["on", "off"] = Field(
        "on", description="llama_cpp: with --n-gpu-layers auto, offload what fits each GPU beside --fit-target, as "
                          "llama-server's --fit; off: every layer.",
    )
    fit_target: int = Field(
        1024, ge=0, le=1 << 20, description="llama_cpp: MiB each GPU keeps free when --fit places layers, as "
                                            "llama-server's --fit-target.",
    )
    fit_ctx: int = Field(
        4096, ge=256, le=1 << 20, description="llama_cpp: with --n-ctx 0, the least context --fit shrinks it to "
                                              "before layers leave the GPUs, as llama-server's --fit-ctx.",
    )
    rpc: Annotated[list[str], NoDecode] = Field(
        [], description="llama_cpp: HOST:PORT,... of llama.cpp rpc-servers whose devices are used as GPUs, as "
                        "llama-server's --rpc.",
    )
    no_mmproj_offload: bool = Field(
        False, description="llama_cpp: keep the vision projector (--mmproj) in host memory, as llama-server's "
                           "--no-mmproj-offload; by default it goes on the first GPU.",
    )
    no_mmap: bool = Field(False, description="llama_cpp: read the GGUF into memory instead of mapping it.")
    mlock: bool = Field(False, description="llama_cpp: lock the model in memory (no swapping).")
    cache_ram: int = Field(
        2048, ge=0, le=1 << 24, description="llama_cpp: host-memory prompt cache in MiB, as llama-server's "
                                            "--cache-ram (0: off; split KV layout only).",
    )

    @field_validator("n_gpu_layers", "n_gpu_layers_draft", mode="before")
    @classmethod
    def _check_n_gpu_layers(cls, value):
        if isinstance(value, str) and value not in ("auto", "all"):
            try:
                value = int(value)
            except ValueError:
                raise ValueError(f"{value!r}: expected a number of layers, auto or all") from None
        if isinstance(value, int) and value < 0:
            raise ValueError(f"{value}: expected 0 or more layers, auto or all")
        return value

    @field_validator("tensor_split", mode="before")
    @classmethod
    def _check_tensor_split(cls, value):
        items = value.split(",") if isinstance(value, str) else \
            [part for x in value for part in (x.split(",") if isinstance(x, str) else [x])]
        try:
            value = [float(x) for x in items if not isinstance(x, str) or x.strip()]
        except ValueError:
            raise ValueError(f"{items!r}: expected shares such as 3,1") from None
        if any(x < 0 for x in value):
            raise ValueError("shares of --tensor-split are 0 or more")
        return value

    @field_validator("rpc", mode="before")
    @classmethod
    def _check_rpc(cls, value):
        items = value.split(",") if isinstance(value, str) else [p for x in value for p in str(x).split(",")]
        out = []
        for item in (x.strip() for x in items if x.strip()):
            host, colon, port = item.rpartition(":")
            if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"{item!r}: expected HOST:PORT (e.g. 192.168.1.2:50052)")
            out.append(item)
        return out

    @field_validator("override_tensor")
    @classmethod
    def _check_override_tensor(cls, value: list[str]) -> list[str]:
        for item in value:
            pattern, eq, buffer = item.rpartition("=")
            if not eq or not pattern or not buffer:
                raise ValueError(f"{item!r}: expected PATTERN=BUFFER (e.g. 'exps=CPU')")
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"{pattern!r} is not a regular expression: {exc}") from None
        return value

    @model_validator(mode="after")
    def _check_cpu_moe(self):
        if self.cpu_moe and self.n_cpu_moe is not None:
            raise ValueError("--cpu-moe keeps every layer's experts in host memory; give it or --n-cpu-moe, not both")
        return self

    @model_validator(mode="after")
    def _check_spec_ngram_cost(self):
        if "spec_ngram_cost" in self.model_fields_set and self.speculative != "ngram":
            raise ValueError("--spec-ngram-cost is for --speculative ngram")
        if "n_gpu_layers_draft" in self.model_fields_set and self.speculative != "draft":
            raise ValueError("--n-gpu-layers-draft is for --speculative draft")
        return self
