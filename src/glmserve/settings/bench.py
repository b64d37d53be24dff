"""``BenchSettings``: ``glmserve bench``'s flags (no engine is imported)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings

from glmserve.settings import cli_config


class BenchSettings(BaseSettings):
    """``glmserve bench``: a streaming load generator for any OpenAI-compatible server."""

    model_config = cli_config("glmserve bench", env_prefix="GLMSERVE_BENCH_")

    url: str = Field("http://127.0.0.1:8000", description="Server base URL (with or without /v1).")
    model: str | None = Field(None, description="Model id to request; none: the server's first model.")
    api_key: str | None = Field(None, description="Bearer token, if the server needs one.")
    concurrency: list[int] = Field(
        [1], description="Requests in flight at once; several values (1,2,4,8) run one after another."
    )
    num_requests: int = Field(32, ge=1, le=1_000_000, description="Requests per concurrency level.")
    input_len: int = Field(32, ge=1, le=1_000_000, description="Approximate prompt length in tokens.")
    output_len: int = Field(128, ge=1, le=1_000_000, description="max_tokens of every request.")
    ignore_eos: bool = Field(False, description="Ask the server to generate exactly output_len tokens.")
    request_rate: float = Field(
        float("inf"), gt=0, description="Requests per second (Poisson arrivals); inf = as fast as possible."
    )
    temperature: float = Field(0.0, ge=0, le=2, description="Sampling temperature (0 = greedy).")
    seed: int = Field(0, description="Seed for prompts and arrival times.")
    timeout: float = Field(600.0, gt=0, description="Seconds before one request counts as failed.")
    json_file: str | None = Field(None, alias="json", description="Write the results as JSON to this file.")
    plot: str | None = Field(None, description="Draw throughput and TTFT against concurrency to this PNG.")
    label: str | None = Field(None, description="Name of the system under test, for the report.")
