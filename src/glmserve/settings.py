"""Settings classes: one source for CLI flags and ``GLMSERVE_*`` environment variables.

Precedence (highest first): command-line flags, environment variables, defaults. Pattern from llama-cpp-python's ``llama_cpp/server/settings.py``.
"""

from __future__ import annotations

import os
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class ServeSettings(BaseSettings):
    """``glmserve serve``: which model, which engine, where to listen."""

    model_config = SettingsConfigDict(
        env_prefix="GLMSERVE_",
        cli_kebab_case=True,
        cli_prog_name="glmserve serve",
        cli_implicit_flags=True,
        extra="ignore",
    )

    model: str | None = Field(
        None,
        description="Model to serve: a .gguf file or a folder with one. "
        "Default: the embedded SmolLM2-135M-Instruct.",
    )
    engine: Literal["llama_cpp"] = Field("llama_cpp", description="Inference engine.")
    host: str = Field("127.0.0.1", description="Address to listen on.")
    port: int = Field(8000, ge=0, le=65535, description="TCP port to listen on.")
    served_model_name: str | None = Field(
        None, description="Model id clients send as `model` (default: the model file's name)."
    )
    api_key: str | None = Field(
        None, description="When set, every route but /health needs 'Authorization: Bearer KEY'."
    )
    n_ctx: int = Field(
        4096, ge=0, le=1 << 20,
        description="Context window in tokens (prompt + output); 0 = the model's training context.",
    )
    n_threads: int = Field(
        default_factory=lambda: max(1, os.cpu_count() or 1), ge=1, le=1024,
        description="CPU threads for generation.",
    )
    max_num_seqs: int = Field(
        8, ge=1, le=256, description="Sequences decoded together in one batch (running requests)."
    )
    max_num_batched_tokens: int = Field(
        63, ge=1, le=1 << 16,
        description="Tokens per engine step: one per running sequence plus prompt chunks (chunked "
        "prefill). Below 64, llama.cpp's CPU backend computes every batch the same way, so a "
        "request's output does not depend on what it is batched with.",
    )
    max_queue: int = Field(
        64, ge=0, le=1 << 16,
        description="Requests that may wait for a free sequence; beyond that the server answers 429.",
    )
    shutdown_timeout: float = Field(
        30.0, ge=0, le=3600,
        description="Seconds to let running requests finish after SIGTERM before they are aborted.",
    )
    chat_template: str | None = Field(
        None, description="Jinja2 chat template file to use instead of the model's own."
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="Server log level."
    )
