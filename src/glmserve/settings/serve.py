"""The settings of ``glmserve serve`` (``ServeSettings``: ``ServerSettings`` and
``ModelSettings`` together; ``DeploySettings``: plus Ray Serve replicas) and of ``glmserve chat``
(``ChatSettings``)."""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings

from glmserve.settings import cli_config
from glmserve.settings.model import ModelSettings
from glmserve.settings.server import ServerSettings


class ServeSettings(BaseSettings, ServerSettings, ModelSettings):
    """``glmserve serve``: the server's settings and those of ``--model`` (also the defaults
    that the models of ``--models-dir`` and ``--config`` inherit)."""

    model_config = cli_config("glmserve serve")


class DeploySettings(ServeSettings):
    """``glmserve serve``: ``ServeSettings`` plus where the app runs: one process (default) or
    Ray Serve replicas (``--replicas``, ``--min/max-replicas`` or ``--ray-address``).

    Also the ``args`` of the ``serve run`` builder (``glmserve.deploy.ray:build``)."""

    model_config = cli_config("glmserve serve")

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
        if self.on_ray and self.fd is not None:
            raise ValueError("--fd serves one process's socket; Ray Serve's proxy listens on --host/--port itself")
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


class ChatSettings(ServeSettings):
    """``glmserve chat``: chat in the terminal, in-process or with any OpenAI-compatible server."""

    model_config = cli_config("glmserve chat")

    url: str | None = Field(
        None, description="Chat with this OpenAI-compatible server instead of a model in-process "
        "(--model is then the server's model id; default: its first)."
    )
    system: str | None = Field(None, description="System prompt.")
    temperature: float | None = Field(None, ge=0, le=2, description="Sampling temperature.")
    top_p: float | None = Field(None, ge=0, le=1, description="Nucleus sampling probability mass.")
    max_tokens: int | None = Field(None, ge=1, description="Most tokens per reply.")

    def unused(self, given: Iterable[str]) -> list[str]:
        """The flags among ``given`` (field names set on the command line) that this chat does
        not use, as ``--kebab-case``, sorted: in-process, the server's own (nothing listens,
        stores or serves several models); with ``--url``, every ``glmserve serve`` flag but
        ``--model`` and ``--api-key`` (the server was started with its own)."""
        serve = set(ServeSettings.model_fields)
        unused = serve - {"model", "api_key"} if self.url else serve - set(ModelSettings.model_fields)
        return sorted(f"--{name.replace('_', '-')}" for name in unused.intersection(given))
