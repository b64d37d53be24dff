"""Settings classes: one source for CLI flags and ``GLMSERVE_*`` environment variables.

Precedence (highest first): command-line flags, environment variables, defaults. Pattern from llama-cpp-python's ``llama_cpp/server/settings.py``.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from glmserve.chat.template import RESERVED_TEMPLATE_VARIABLES
from glmserve.engine.llama_cpp.settings import LlamaCppSettings
from glmserve.engine.transformers.settings import TransformersSettings
from glmserve.engine.vllm.settings import VllmSettings
from glmserve.protocol.chat import ChatCompletionRequest
from glmserve.serving.generation.sampling import GENERATION_DEFAULTS
from glmserve.serving.structured.schema_check import SchemaLimits


def _cli_config(prog: str, env_prefix: str = "GLMSERVE_") -> SettingsConfigDict:
    """Flags in kebab-case, booleans as bare flags, ``<env_prefix><NAME>`` variables."""
    return SettingsConfigDict(
        env_prefix=env_prefix, cli_kebab_case=True, cli_prog_name=prog, cli_implicit_flags=True, extra="ignore"
    )


_ADAPTER_NAME = re.compile(r"^[A-Za-z0-9_.\-/:]{1,128}$")


class ServeSettings(BaseSettings, LlamaCppSettings, TransformersSettings, VllmSettings):
    """``glmserve serve``: which model, which engine, where to listen; composed with each
    engine's own settings class (``LlamaCppSettings``, ``TransformersSettings``,
    ``VllmSettings``: their fields and defaults), as llama-cpp-python composes ``ServerSettings``
    and ``ModelSettings``. A field of an engine other than ``engine`` is refused at start-up
    (``engine.check_engine_settings``)."""

    model_config = _cli_config("glmserve serve")

    model: str | None = Field(
        None,
        description="A .gguf file or its folder, or a Hub name fetched into the HF cache (ORG/NAME-GGUF:QUANT; "
                    "transformers, vllm: ORG/NAME, a folder).",
    )
    offline: bool = Field(
        False, description="Never reach the Hugging Face Hub: a --model by name must be in its cache (as "
                           "HF_HUB_OFFLINE=1).",
    )
    engine: Literal["llama_cpp", "transformers", "vllm"] = Field(
        "llama_cpp", description="Inference engine: llama_cpp (GGUF on CPU), transformers (Hugging Face models, "
                                 "CPU or GPU) or vllm (vLLM, GPUs).",
    )
    lora: list[str] = Field(
        [], description="A LoRA adapter that requests pick with model NAME (repeatable): a GGUF LoRA file "
                        "(llama_cpp) or a PEFT folder."
    )
    max_loras: int = Field(
        8, ge=1, le=64, description="LoRA adapters held in memory per model; the least recently used idle one is "
                                    "unloaded to load another.",
    )
    models_dir: list[str] = Field(
        [], description="Also serve every .gguf file and Hugging Face model folder under this folder, each loaded "
                        "on first use (repeatable).",
    )
    config: str | None = Field(
        None, description="Also serve the models a YAML or JSON file declares ({models: [{name, model, ...}]}), "
                          "each with its own flags.",
    )
    max_loaded_models: int | None = Field(
        None, ge=1, le=1024, description="With several models: most loaded at once; the least recently used idle "
                                         "one is unloaded first.",
    )
    memory_budget: int | None = Field(
        None, ge=1, description="With several models: bytes the loaded models may take together (estimated); least "
                                "recently used idle one out first.",
    )
    keep_alive: str = Field(
        "5m", description="With several models: how long a model stays loaded after its last request (300, 5m, 1h; "
                          "0: unload at once; -1: keep).",
    )
    allow_runtime_lora_updating: bool = Field(
        False, description="Serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter: clients then name "
                           "adapter files on this machine.",
    )
    allowed_media_domains: list[str] = Field(
        [], description="An image host exempt from the public-address check, e.g. an intranet image server "
                        "(repeatable)."
    )
    max_image_bytes: int = Field(20 * 1024 * 1024, ge=1, description="Largest image accepted, in bytes.")
    max_image_pixels: int = Field(40_000_000, ge=1, description="Largest image accepted, width x height.")
    image_fetch_timeout: float = Field(10.0, gt=0, le=600, description="Seconds allowed to fetch one image URL, "
                                                                       "redirects included.")
    host: str = Field("127.0.0.1", description="Address to listen on.")
    port: int = Field(8000, ge=0, le=65535, description="TCP port to listen on.")
    served_model_name: str | None = Field(
        None, description="Model id that clients send as model."
    )
    api_key: Annotated[list[str], NoDecode] = Field(
        [], description="Require 'Authorization: Bearer KEY' (Anthropic's: or x-api-key) but on /health, / "
                        "and /ui; repeatable: each key owns its stored objects."
    )
    admin_api_key: Annotated[list[str], NoDecode] = Field(
        [], description="Keys for model load/unload, LoRA load/unload and /metrics (--api-key's keys get a "
                        "403 there) and all other routes; repeat it (or KEY1,KEY2)."
    )
    n_ctx: int = Field(
        4096, ge=0, le=1 << 20,
        description="Context window in tokens, prompt plus output (0: the model's training context); vllm: "
                    "max_model_len, the model's own unless given.",
    )
    max_num_seqs: int | None = Field(
        None, ge=1, le=4096, description="Sequences decoded together in one batch (running requests); /v1/models "
                                         "shows the value in force.",
    )
    max_queue: int | None = Field(
        None, ge=0, le=1 << 20,
        description="Requests that may wait for a free sequence; beyond that the server answers 429 with "
                    "Retry-After.",
    )
    max_n: int = Field(
        8, ge=1, le=128,
        description="Largest n (choices per request) a request may ask for; each choice is one sequence.",
    )
    max_embedding_inputs: int = Field(
        2048, ge=1, le=1 << 20, description="Most inputs one /v1/embeddings request may hold (OpenAI's limit is "
                                            "2048).",
    )
    max_embedding_tokens: int = Field(
        32768, ge=1, le=1 << 30,
        description="Most tokens one /v1/embeddings request may hold, all inputs together (each input also fits "
                    "--n-ctx).",
    )
    max_request_bytes: int = Field(
        64 * 1024 * 1024, ge=1024, le=1 << 34, description="Largest request body accepted, in bytes (413 beyond)."
    )
    client_header_timeout: float = Field(
        30.0, gt=0, le=3600,
        description="Seconds a connection may take to send a request's headers before it is closed.",
    )
    client_body_timeout: float = Field(
        30.0, gt=0, le=3600,
        description="Seconds the server waits for the next part of a request body before answering 408.",
    )
    timeout_keep_alive: int = Field(
        5, ge=1, le=3600, description="Seconds an idle keep-alive connection stays open (uvicorn's setting)."
    )
    allowed_origins: list[str] = Field(
        [], description="A browser origin allowed to call the API from another site (CORS), e.g. "
                        "http://localhost:3000; * for any (repeatable).",
    )
    ui: bool = Field(
        True, description="Serve the web chat page at / (--no-ui: off).",
    )
    max_schema_depth: int = Field(
        32, ge=2, le=256, description="Deepest nesting of a client JSON schema (response_format, tool parameters)."
    )
    max_schema_nodes: int = Field(
        10_000, ge=10, le=1_000_000, description="Most values (objects, arrays, scalars) in one client JSON "
                                                 "schema."
    )
    max_schema_repeat: int = Field(
        1000, ge=1, le=10_000,
        description="Largest repetition bound a constrained schema may set (minLength, maxItems, {m,n}, ...): each "
                    "is spelled out in the grammar.",
    )
    max_grammar_bytes: int = Field(
        512 * 1024, ge=1024, le=16 * 1024 * 1024,
        description="Largest grammar a request's constraints (response_format, forced tool calls) may compile to, "
                    "in bytes.",
    )
    shutdown_timeout: float = Field(
        30.0, ge=0, le=3600,
        description="Seconds running requests may go on after SIGTERM before they are aborted.",
    )
    chat_template: str | None = Field(
        None, description="A Jinja2 chat template file to use instead of the model's own."
    )
    default_chat_template_kwargs: dict[str, Any] = Field(
        {}, description='Chat template variables for requests that do not set them, e.g. \'{"enable_thinking": '
                        "false}'.",
    )
    override_generation_config: dict[str, float] = Field(
        {}, description='Sampling defaults for requests that leave them out (vLLM\'s flag), e.g. \'{"temperature": '
                        '0.6, "max_new_tokens": 4096}\'.',
    )
    reasoning_budget: int = Field(
        -1, ge=-1, description="Reasoning tokens before glmserve ends the reasoning, for requests that set no "
                               "budget (-1: no limit; 0: no reasoning).")
    tool_call_parser: Literal["auto", "none", "glm4", "glm45", "glm47", "hermes", "generic"] = Field(
        "auto", description="Tool-call format; auto: from the chat template (generic when it has none); none: no "
                            "tool calling."
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="Server log level."
    )
    state_dir: str = Field(
        str(Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "glmserve"),
        description="Directory of what outlives a restart: the stored responses' SQLite file and the key that seals "
                    "encrypted_content."
    )
    database_url: str | None = Field(
        None, description="Keep stored responses in this PostgreSQL database (postgresql://...) instead of "
                          "--state-dir's SQLite file."
    )
    store_ttl: str = Field("30d", description="How long a stored response is kept (a number of seconds, or a "
                                              "duration such as 30d or 12h).")
    store_max_bytes: int = Field(1 << 30, ge=1, description="Bytes the state keeps in all (responses, conversations, "
                                                            "files, batches); past it the oldest responses go.")
    store_max_bytes_per_key: int | None = Field(
        None, ge=1, description="Bytes the state keeps for one API key; past it that key's oldest responses go, "
                                "then its uploads are refused.")

    @field_validator("api_key", "admin_api_key", mode="before")
    @classmethod
    def _keys(cls, value: Any) -> Any:
        """Keys separated by commas (``GLMSERVE_API_KEY=a,b``; the repeated flag arrives so), a
        JSON list of keys, or a list."""
        if value is None:
            return []
        if isinstance(value, str):
            return json.loads(value) if value.lstrip().startswith("[") else value.split(",")
        return value

    @field_validator("api_key", "admin_api_key")
    @classmethod
    def _check_keys(cls, value: list[str]) -> list[str]:
        if any(not key.strip() for key in value):
            raise ValueError("an API key cannot be empty")
        return value

    @field_validator("database_url")
    @classmethod
    def _check_database_url(cls, value: str | None) -> str | None:
        from glmserve.state import sqlalchemy_url

        if value is not None:
            sqlalchemy_url(value)
        return value

    @field_validator("store_ttl")
    @classmethod
    def _check_store_ttl(cls, value: str) -> str:
        from glmserve.models.catalog import parse_keep_alive

        try:
            seconds = parse_keep_alive(value)
        except ValueError:
            raise ValueError(f"{value!r} is not a duration (e.g. 2592000, 30d, 12h)") from None
        if value.strip().startswith("-") or seconds <= 0:
            raise ValueError("must be more than 0 seconds")
        return value

    def state_database_url(self) -> str:
        """``--database-url``, else the SQLite file ``state.db`` in ``--state-dir``."""
        return self.database_url or f"sqlite:///{Path(self.state_dir) / 'state.db'}"

    def store_ttl_s(self) -> float:
        """``--store-ttl`` in seconds."""
        from glmserve.models.catalog import parse_keep_alive

        return parse_keep_alive(self.store_ttl)

    @field_validator("lora")
    @classmethod
    def _check_lora(cls, value: list[str]) -> list[str]:
        names = set()
        for item in value:
            name, eq, path = item.partition("=")
            if not eq or not _ADAPTER_NAME.match(name) or not path:
                raise ValueError(f"{item!r}: expected NAME=PATH (NAME: letters, digits, '_', '-', '.', '/')")
            if name in names:
                raise ValueError(f"LoRA adapter name {name!r} given twice")
            names.add(name)
        return value

    @model_validator(mode="after")
    def _check_max_loras(self) -> ServeSettings:
        if len(self.lora) > self.max_loras:
            raise ValueError(f"--lora gives {len(self.lora)} adapters, more than --max-loras {self.max_loras} "
                             "holds at once: raise --max-loras")
        return self

    @field_validator("keep_alive")
    @classmethod
    def _check_keep_alive(cls, value: str) -> str:
        from glmserve.models.catalog import parse_keep_alive

        parse_keep_alive(value)
        return value

    @property
    def many_models(self) -> bool:
        """Whether ``--models-dir`` or ``--config`` adds models to ``--model``."""
        return bool(self.models_dir or self.config)

    @field_validator("default_chat_template_kwargs")
    @classmethod
    def _check_template_kwargs(cls, value: dict[str, Any]) -> dict[str, Any]:
        taken = sorted(set(value) & RESERVED_TEMPLATE_VARIABLES)
        if taken:
            raise ValueError(f"{', '.join(taken)}: set by the server, not a chat template keyword")
        return value

    @field_validator("override_generation_config")
    @classmethod
    def _check_generation_config(cls, value: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(value) - GENERATION_DEFAULTS)
        if unknown:
            raise ValueError(f"{', '.join(unknown)}: not a sampling field (one of {', '.join(sorted(GENERATION_DEFAULTS))})")
        max_new = value.get("max_new_tokens")
        if max_new is not None and (max_new != int(max_new) or max_new < 1):
            raise ValueError("max_new_tokens: a whole number of tokens, at least 1")
        try:  # within the bounds a request's own values have
            ChatCompletionRequest.model_validate({"model": "-", "messages": [{"role": "user", "content": "-"}], **value},
                                                 strict=False)  # JSON numbers here are floats: top_k 40.0
        except ValidationError as exc:
            raise ValueError("; ".join(f"{e['loc'][0]}: {e['msg']}" for e in exc.errors())) from None
        return value

    def schema_limits(self) -> SchemaLimits:
        """The ``--max-schema-*`` and ``--max-grammar-bytes`` bounds."""
        return SchemaLimits(self.max_schema_depth, self.max_schema_nodes, self.max_schema_repeat,
                            self.max_grammar_bytes)

    def lora_adapters(self) -> dict[str, Path]:
        """``--lora`` as {adapter name: path}, in the order given."""
        return {name: Path(path).expanduser() for name, _, path in (item.partition("=") for item in self.lora)}


# each engine's settings class, by --engine name (the CLI help groups their flags in this order)
ENGINE_SETTINGS: dict[str, type[BaseModel]] = {
    "llama_cpp": LlamaCppSettings, "transformers": TransformersSettings, "vllm": VllmSettings,
}


class DeploySettings(ServeSettings):
    """``glmserve serve``: ``ServeSettings`` plus where the app runs: one process (default) or
    Ray Serve replicas (``--replicas``, ``--min/max-replicas`` or ``--ray-address``).

    Also the ``args`` of the ``serve run`` builder (``glmserve.deploy.ray:build``)."""

    model_config = _cli_config("glmserve serve")

    replicas: int | None = Field(
        None, ge=1, le=4096, description="Serve with this many Ray Serve replicas, each with its own engine, "
                                         "behind Ray Serve's HTTP proxy on --host/--port.",
    )
    ray_address: str | None = Field(
        None, description="Join this Ray cluster (e.g. 10.0.0.1:6379, or auto) instead of starting a local one; "
                          "implies Ray Serve replicas.",
    )
    replica_cpus: float | None = Field(
        None, ge=0, le=1024, description="CPUs reserved for each replica (also its --n-threads when that is not "
                                         "given).",
    )
    replica_gpus: float | None = Field(
        None, ge=0, le=1024, description="GPUs reserved for each replica (vllm with --distributed-executor-backend "
                                         "ray: one per worker instead).",
    )
    min_replicas: int | None = Field(
        None, ge=1, le=4096, description="Ray Serve autoscaling: fewest replicas (with --max-replicas).",
    )
    max_replicas: int | None = Field(
        None, ge=1, le=4096, description="Ray Serve autoscaling: most replicas (with --min-replicas); one is added "
                                         "while requests wait for a sequence.",
    )

    @model_validator(mode="after")
    def _check_ray(self) -> DeploySettings:
        autoscale = (self.min_replicas, self.max_replicas)
        if (autoscale[0] is None) != (autoscale[1] is None):
            raise ValueError("--min-replicas and --max-replicas go together")
        if autoscale[0] is not None:
            if self.replicas is not None:
                raise ValueError("give --replicas (a fixed count) or --min/max-replicas (autoscaling), not both")
            if autoscale[0] > autoscale[1]:
                raise ValueError("--min-replicas is larger than --max-replicas")
        if self.on_ray and self.many_models:
            raise ValueError("--models-dir and --config serve several models in one process; Ray Serve replicas "
                             "serve one model each: deploy one application per model (docs/guides/ray.md)")
        if not self.many_models:
            for name in ("max_loaded_models", "memory_budget", "keep_alive"):
                if name in self.model_fields_set:
                    raise ValueError(f"--{name.replace('_', '-')} needs several models (--models-dir or --config)")
        if self.on_ray and self.allow_runtime_lora_updating:
            raise ValueError("--allow-runtime-lora-updating would load an adapter into one replica only; give "
                             "the adapters with --lora when serving Ray Serve replicas")
        if not self.on_ray:
            for name in ("replica_cpus", "replica_gpus"):
                if getattr(self, name) is not None:
                    raise ValueError(f"--{name.replace('_', '-')} needs Ray Serve replicas (--replicas, "
                                     "--min/max-replicas or --ray-address)")
        return self

    @property
    def on_ray(self) -> bool:
        """Whether the app runs as Ray Serve replicas."""
        return any(v is not None for v in (self.replicas, self.min_replicas, self.ray_address))


class BenchSettings(BaseSettings):
    """``glmserve bench``: a streaming load generator for any OpenAI-compatible server."""

    model_config = _cli_config("glmserve bench", env_prefix="GLMSERVE_BENCH_")

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


class ChatSettings(ServeSettings):
    """``glmserve chat``: chat in the terminal, in-process or with any OpenAI-compatible server."""

    model_config = _cli_config("glmserve chat")

    url: str | None = Field(
        None, description="Chat with this OpenAI-compatible server instead of a model in-process "
        "(--model is then the server's model id; default: its first)."
    )
    system: str | None = Field(None, description="System prompt.")
    temperature: float | None = Field(None, ge=0, le=2, description="Sampling temperature.")
    top_p: float | None = Field(None, ge=0, le=1, description="Nucleus sampling probability mass.")
    max_tokens: int | None = Field(None, ge=1, description="Most tokens per reply.")
