"""The command-line flags as users read them: in groups, each flag with one line of help that
ends in its default.

``glmserve serve --help`` (``cli.py``) and the docs' flag reference (``docs/reference/flags.md``,
kept up to date by ``scripts/docs_hooks.py``) are both rendered from ``flag_groups``, so the two
cannot drift apart. The flags themselves, their types, bounds and help sentences are the settings
classes' fields (``settings.py`` and each engine's ``settings.py``); this module only orders them
and spells their defaults.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings

from glmserve.settings import ENGINE_SETTINGS, DeploySettings, ServeSettings

# (title, what the group is for, its ServeSettings fields in order); "engine" also takes every
# engine settings class's fields, and "scale-out" DeploySettings' own
SERVE_GROUPS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("server", "Where it listens and who may call it.",
     ("host", "port", "api_key", "admin_api_key", "allowed_origins", "ui", "state_dir", "database_url", "store_ttl",
      "store_max_bytes", "store_max_bytes_per_key", "log_level", "shutdown_timeout")),
    ("model", "What is served and how prompts are rendered and answered.",
     ("model", "offline", "served_model_name", "n_ctx", "chat_template", "default_chat_template_kwargs",
      "override_generation_config", "reasoning_budget", "tool_call_parser", "lora", "max_loras",
      "allow_runtime_lora_updating", "models_dir", "config", "max_loaded_models", "memory_budget", "keep_alive")),
    ("engine", "The engine and its flags; each engine flag's help starts with the engines that read it, and "
               "a flag the chosen engine does not read stops start-up.",
     ("engine", "max_num_seqs")),
    ("limits", "Bounds on what one client may cost.",
     ("max_queue", "max_n", "max_request_bytes", "client_header_timeout", "client_body_timeout",
      "timeout_keep_alive", "max_embedding_inputs", "max_embedding_tokens", "max_schema_depth",
      "max_schema_nodes", "max_schema_repeat", "max_grammar_bytes", "max_image_bytes", "max_image_pixels",
      "image_fetch_timeout", "allowed_media_domains")),
    ("scale-out", "Ray Serve replicas beyond one process (pip install 'glmserve[ray]').", ()),
)

# how a default reads where its value alone says too little (None, computed, a size in bytes)
DEFAULT_SHOWN: dict[str, str] = {
    "model": "the embedded SmolLM2-135M-Instruct",
    "served_model_name": "the model file's name without .gguf",
    "api_key": "none: no key needed",
    "admin_api_key": "none: every --api-key key is an admin",
    "database_url": "none: SQLite in --state-dir",
    "store_max_bytes": "1073741824 (1 GiB)",
    "store_max_bytes_per_key": "none: only --store-max-bytes",
    "state_dir": "$XDG_DATA_HOME/glmserve, else ~/.local/share/glmserve",
    "chat_template": "the model's own",
    "config": "none",
    "max_loaded_models": "no limit",
    "memory_budget": "no limit",
    "max_num_seqs": "8; vllm: vLLM's own, 256 or 1024 on H100/H200-class GPUs",
    "max_queue": "8 x the --max-num-seqs in force",
    "max_request_bytes": "67108864 (64 MiB)",
    "max_image_bytes": "20971520 (20 MiB)",
    "max_grammar_bytes": "524288 (512 KiB)",
    "n_threads": "all CPUs",
    "max_num_batched_tokens": "512, or 63 with --batch-invariant; vllm: vLLM's own, 2048 or 8192 on H100/H200-class",
    "speculative": "off",
    "draft_model": "none",
    "mmproj": "the one mmproj-*.gguf beside the model, if any",
    "distributed_executor_backend": "vLLM's choice",
    "kv_cache_memory": "none: from --gpu-memory-utilization",
    "replicas": "none: one process",
    "ray_address": "none: a local Ray",
    "replica_cpus": "1",
    "replica_gpus": "0",
}

# the value's placeholder in usage, where its type says too little
METAVARS: dict[str, str] = {
    "model": "MODEL", "draft_model": "PATH", "mmproj": "FILE", "lora": "NAME=PATH", "models_dir": "DIR",
    "state_dir": "DIR", "config": "FILE", "chat_template": "FILE", "api_key": "KEY", "admin_api_key": "KEY", "host": "ADDRESS", "ray_address": "ADDRESS",
    "served_model_name": "NAME", "allowed_origins": "ORIGIN", "allowed_media_domains": "HOST",
    "default_chat_template_kwargs": "JSON", "override_generation_config": "JSON", "engine_arg": "KEY=VALUE",
    "keep_alive": "DURATION", "store_ttl": "DURATION", "database_url": "URL", "memory_budget": "BYTES", "url": "URL", "json_file": "FILE", "plot": "FILE",
}


@dataclass(frozen=True)
class Flag:
    """One flag: ``name`` the settings field, ``flag`` the option (``--n-ctx``), ``metavar`` its
    value's placeholder (None for an on/off flag, which also has ``--no-...``), ``help`` one line
    ending in ``(default: ...)``, ``env`` the environment variable that sets it too."""

    name: str
    flag: str
    metavar: str | None
    help: str
    env: str


@dataclass(frozen=True)
class FlagGroup:
    """A titled group of flags, as ``--help`` and the docs list them."""

    title: str
    description: str
    flags: tuple[Flag, ...]


def _default_text(cls: type[BaseSettings], name: str, field: FieldInfo) -> str:
    if name in DEFAULT_SHOWN and issubclass(cls, ServeSettings):
        return DEFAULT_SHOWN[name]
    value = field.default
    if value is PydanticUndefined:
        raise ValueError(f"{name}: a computed default needs its text in flags.DEFAULT_SHOWN")
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None or value == []:
        return "none"
    if isinstance(value, list):
        return ",".join(map(str, value))
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dict):
        return "{}" if not value else str(value)
    return str(value)


def _metavar(cls: type[BaseSettings], name: str, field: FieldInfo) -> str | None:
    if name in METAVARS and (issubclass(cls, ServeSettings) or name not in ServeSettings.model_fields):
        return METAVARS[name]
    annotation = str(field.annotation)
    if field.annotation is bool:
        return None
    choices = getattr(field.annotation, "__args__", None)
    if "Literal" in annotation and choices:
        literal = next((a for a in choices if "Literal" in str(a)), field.annotation)
        values = getattr(literal, "__args__", choices)
        return "{" + ",".join(map(str, values)) + "}"
    if "float" in annotation:
        return "NUMBER"
    if "int" in annotation:
        return "N"
    return "TEXT"


def describe(cls: type[BaseSettings], name: str) -> Flag:
    """The ``Flag`` of ``cls``'s field ``name``."""
    field = cls.model_fields[name]
    option = field.alias or name
    prefix = cls.model_config.get("env_prefix", "")
    return Flag(name=option, flag="--" + option.replace("_", "-"), metavar=_metavar(cls, name, field),
                help=f"{field.description} (default: {_default_text(cls, name, field)})", env=(prefix + option).upper())


def flag_groups(cls: type[BaseSettings]) -> list[FlagGroup]:
    """``cls``'s flags in help order: for a ``ServeSettings`` (and so ``glmserve serve``) the
    groups of ``SERVE_GROUPS``, after a first group of any field of ``cls`` that none of them
    names (``glmserve chat``'s own), titled by the command; for any other class that group alone."""
    names = list(cls.model_fields)
    groups: list[tuple[str, str, list[str]]] = []
    if issubclass(cls, ServeSettings):
        engine_fields = [n for settings in ENGINE_SETTINGS.values() for n in settings.model_fields]
        deploy_fields = [n for n in DeploySettings.model_fields if n not in ServeSettings.model_fields]
        for title, description, fields in SERVE_GROUPS:
            extra = engine_fields if title == "engine" else deploy_fields if title == "scale-out" else []
            groups.append((title, description, [n for n in dict.fromkeys([*fields, *extra]) if n in names]))
    grouped = {n for _, _, fields in groups for n in fields}
    rest = [n for n in names if n not in grouped]
    if rest:
        command = (cls.model_config.get("cli_prog_name") or "options").split()[-1]
        groups.insert(0, (command, "", rest))
    return [FlagGroup(title, description, tuple(describe(cls, n) for n in fields))
            for title, description, fields in groups if fields]
