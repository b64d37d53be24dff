"""The ``llama_cpp`` engine's configuration (``EngineConfig``), as ``engine/llama_cpp/__init__.py``
builds it from the settings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from glmserve.engine.llama_cpp.settings import DEFAULT_MAX_NUM_BATCHED_TOKENS
from glmserve.engine.llama_cpp.speculative import SpeculativeConfig
from glmserve.engine.scheduler import KVLayout
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
    speculative: SpeculativeConfig | None = None  # --speculative ngram|draft
    runner: Literal["auto", "generate", "pooling"] = "auto"  # pooling: embeddings only, no generation context
