"""``TransformersSettings``: the flags of ``--engine transformers``, composed into ``ServeSettings``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from glmserve.engine.fields import Dtype, NThreads, StreamIntervalMs, TrustRemoteCode
from glmserve.engine.settings import EngineSettings


class TransformersSettings(EngineSettings):
    """transformers engine: Hugging Face models (PEFT adapters, vision) on CPU or GPU."""

    dtype: Dtype
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="transformers: where the model runs; auto: cuda when available, else cpu."
    )
    trust_remote_code: TrustRemoteCode
    n_threads: NThreads
    stream_interval_ms: StreamIntervalMs
