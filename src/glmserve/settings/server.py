"""``ServerSettings``: the settings of the whole server, never of one model of it; in groups
(each class one group of ``glmserve serve --help``)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator
from pydantic_settings import NoDecode

from glmserve.models.keep_alive import parse_keep_alive


class ListenSettings(BaseModel):
    """Where it listens and who may call it."""

    host: str = Field("127.0.0.1", description="Address to listen on.")
    port: int = Field(8000, ge=0, le=65535, description="TCP port to listen on.")
    fd: int | None = Field(
        None, ge=0, description="Serve on this listening socket, a file descriptor inherited from the process that "
                                "started glmserve (not with --host/--port).",
    )
    api_key: Annotated[list[str], NoDecode] = Field(
        [], description="Require 'Authorization: Bearer KEY' (Anthropic's: or x-api-key) but on /health, / "
                        "and /ui; repeatable: each key owns its stored objects."
    )
    admin_api_key: Annotated[list[str], NoDecode] = Field(
        [], description="Keys for model load/unload, LoRA load/unload and /metrics (--api-key's keys get a "
                        "403 there) and all other routes; repeat it (or KEY1,KEY2)."
    )
    allowed_origins: list[str] = Field(
        [], description="A browser origin allowed to call the API from another site (CORS), e.g. "
                        "http://localhost:3000; * for any (repeatable).",
    )
    ui: bool = Field(
        True, description="Serve the web chat page at / (--no-ui: off).",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="Server log level."
    )
    shutdown_timeout: float = Field(
        30.0, ge=0, le=3600,
        description="Seconds running requests may go on after SIGTERM before they are aborted.",
    )

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

    @model_validator(mode="after")
    def _check_fd(self) -> ListenSettings:
        if self.fd is not None and {"host", "port"} & self.model_fields_set:
            raise ValueError("--fd serves a socket that is bound already: --host and --port cannot apply to it")
        return self


def _duration(value: str, minimum: float, examples: str, maximum: float = math.inf) -> str:
    """``value`` if it is a duration (``parse_keep_alive``'s forms) of more than 0 seconds,
    within ``minimum`` and ``maximum``; raises ``ValueError`` naming ``examples`` of the form
    otherwise."""
    try:
        seconds = parse_keep_alive(value)
    except ValueError:
        raise ValueError(f"{value!r} is not a duration (e.g. {examples})") from None
    if value.strip().startswith("-") or seconds <= 0 or seconds < minimum:
        raise ValueError(f"must be at least {minimum:g} seconds" if minimum else "must be more than 0 seconds")
    if seconds > maximum:
        raise ValueError(f"must be at most {maximum:g} seconds")
    return value


MIN_BATCH_LEASE_S = 3.0  # a claim renewed every third of it: a second between renewals at least
MAX_BATCH_LEASE_S = 86400.0  # a dead server's lines resumed within a day


class StateSettings(BaseModel):
    """What outlives a restart: stored responses, conversations, files and batches."""

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
    batch_lease: str = Field("30s", description="How long a batch line's claim holds unrenewed before another server, "
                                                "or this one restarted, runs the line again (3s to 1d).")
    store_max_bytes: int = Field(1 << 30, ge=1, description="Bytes the state keeps in all (responses, conversations, "
                                                            "files, batches); past it the oldest responses go.")
    store_max_bytes_per_key: int | None = Field(
        None, ge=1, description="Bytes one API key keeps (default: --store-max-bytes / the number of keys); past it "
                                "its oldest responses go, then its writes are refused.")

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
        return _duration(value, 0.0, "2592000, 30d, 12h")

    @field_validator("batch_lease")
    @classmethod
    def _check_batch_lease(cls, value: str) -> str:
        return _duration(value, MIN_BATCH_LEASE_S, "30, 30s, 2m", MAX_BATCH_LEASE_S)

    def batch_lease_s(self) -> float:
        """``--batch-lease`` in seconds."""
        return parse_keep_alive(self.batch_lease)

    def state_database_url(self) -> str:
        """``--database-url``, else the SQLite file ``state.db`` in ``--state-dir``."""
        return self.database_url or f"sqlite:///{Path(self.state_dir) / 'state.db'}"

    def store_ttl_s(self) -> float:
        """``--store-ttl`` in seconds."""
        return parse_keep_alive(self.store_ttl)


class ModelsSettings(BaseModel):
    """Several models in one server, and LoRA adapters loaded at run time."""

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

    @field_validator("keep_alive")
    @classmethod
    def _check_keep_alive(cls, value: str) -> str:
        parse_keep_alive(value)
        return value

    @property
    def many_models(self) -> bool:
        """Whether ``--models-dir`` or ``--config`` adds models to ``--model``."""
        return bool(self.models_dir or self.config)


class ConnectionLimits(BaseModel):
    """Bounds on what one connection may cost."""

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


class ServerSettings(ListenSettings, StateSettings, ModelsSettings, ConnectionLimits):
    """The whole server's settings (``ListenSettings``, ``StateSettings``, ``ModelsSettings``,
    ``ConnectionLimits``)."""
