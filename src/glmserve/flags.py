"""The command-line flags of ``glmserve serve``, ``chat`` and ``bench`` as users read them: in
groups, each flag with one line of help that ends in its default, and parsed (``parse_flags``:
pydantic-settings' CLI source over a settings class; a bad flag is one line and exit status 2).

``glmserve serve --help`` and the docs' flag reference (``docs/reference/flags.md``, kept up to
date by ``scripts/docs_hooks.py``) are both rendered from ``flag_groups``, so the two cannot
drift apart. The flags themselves, their types, bounds and help sentences are the settings
classes' fields (the ``glmserve.settings`` package and each engine's ``settings.py``); this module
only orders them, spells their defaults and parses them.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings, CliApp, CliSettingsSource, SettingsError

from glmserve.engine.settings import EngineSettings, own_fields
from glmserve.settings.model import ENGINE_SETTINGS, AnswerSettings, RequestLimits
from glmserve.settings.serve import DeploySettings, ServeSettings
from glmserve.settings.server import ConnectionLimits, ListenSettings, ModelsSettings, StateSettings

# glmserve serve's flag groups in help order: (title, the settings class whose own fields the
# group lists, in their order; its docstring's first paragraph describes the group). "engine"
# (None) lists every engine settings class's own fields (ENGINE_SETTINGS), "scale-out"
# DeploySettings' own
SERVE_GROUPS: tuple[tuple[str, type[BaseModel] | None], ...] = (
    ("server", ListenSettings),
    ("model", EngineSettings),
    ("answers", AnswerSettings),
    ("engine", None),
    ("limits", RequestLimits),
    ("connections", ConnectionLimits),
    ("models", ModelsSettings),
    ("state", StateSettings),
    ("scale-out", DeploySettings),
)
ENGINE_GROUP = ("The engine's flags; each one's help starts with the engines that read it, and a flag the chosen "
                "engine does not read stops start-up.")
SCALE_OUT_GROUP = "Ray Serve replicas beyond one process (pip install '.[ray]' in the glmserve checkout)."


def serve_group_fields() -> list[tuple[str, str, list[str]]]:
    """``SERVE_GROUPS`` as (title, description, field names): each class's own fields (not
    those of the classes it extends)."""
    groups = []
    for title, cls in SERVE_GROUPS:
        if cls is None:  # the engines' own flags, in the order of their classes' fields
            fields = [n for settings in ENGINE_SETTINGS.values() for n in settings.model_fields
                      if n in own_fields(settings)]
            groups.append((title, ENGINE_GROUP, list(dict.fromkeys(fields))))
            continue
        inherited = {n for base in cls.__mro__[1:] for n in getattr(base, "model_fields", {})}
        fields = [n for n in cls.model_fields if n not in inherited]
        description = SCALE_OUT_GROUP if cls is DeploySettings else (cls.__doc__ or "").split("\n\n")[0]
        groups.append((title, " ".join(description.split()), fields))
    return groups


# how a default reads where its value alone says too little (None, computed, a size in bytes)
DEFAULT_SHOWN: dict[str, str] = {
    "model": "the embedded SmolLM2-135M-Instruct",
    "served_model_name": "a GGUF file's name without .gguf, a folder's name, a Hub model's ORG/NAME",
    "api_key": "none: no key needed",
    "admin_api_key": "none: every --api-key key is an admin",
    "database_url": "none: SQLite in --state-dir",
    "store_max_bytes": "1073741824 (1 GiB)",
    "store_max_bytes_per_key": "--store-max-bytes / the number of --api-key and --admin-api-key keys",
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
    "keep_alive": "DURATION", "tensor_split": "SHARE,SHARE,...", "store_ttl": "DURATION", "batch_lease": "DURATION", "database_url": "URL", "memory_budget": "BYTES", "url": "URL", "json_file": "FILE", "plot": "FILE",
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
        number = ["N"] if any(a is int for a in choices) else []  # int | Literal[...]: N or a word
        return "{" + ",".join([*number, *map(str, values)]) + "}"
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
        groups = [(title, description, [n for n in fields if n in names])
                  for title, description, fields in serve_group_fields()]
    grouped = {n for _, _, fields in groups for n in fields}
    rest = [n for n in names if n not in grouped]
    if rest:
        command = (cls.model_config.get("cli_prog_name") or "options").split()[-1]
        groups.insert(0, (command, "", rest))
    return [FlagGroup(title, description, tuple(describe(cls, n) for n in fields))
            for title, description, fields in groups if fields]


# the command line: pydantic-settings' parser of a settings class, with these groups

HELP_DESCRIPTION = {
    "glmserve serve": "Start the OpenAI- and Anthropic-compatible server. Each flag is also an environment variable "
                      "(GLMSERVE_<NAME>, e.g. GLMSERVE_N_CTX=8192); flags win.",
    "glmserve chat": "Chat in the terminal: with a model in-process, or with any OpenAI-compatible server (--url).",
    "glmserve bench": "Load-test any OpenAI-compatible server: TTFT, TPOT, ITL and throughput per concurrency.",
}


def fail(message: str, code: int = 1) -> int:
    """``message`` as glmserve's one-line error on stderr; returns ``code`` (the exit status)."""
    print(f"glmserve: error: {message}", file=sys.stderr)
    return code


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Each flag's help on one line (``flags.Flag.help`` is one sentence and its default)."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=40)

    def _split_lines(self, text: str, width: int) -> list[str]:
        return [text]


class _OnOff(argparse.BooleanOptionalAction):
    """An on/off flag, ``--x`` on and ``--no-x`` off, right for a field whose own name starts
    with ``no_`` too: argparse's ``BooleanOptionalAction`` turns any option starting with
    ``--no-`` off, so ``--no-mmap`` itself set ``no_mmap`` to False."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        if option_string in self.option_strings:
            setattr(namespace, self.dest, option_string == self.option_strings[0])


def _cli_source(cls: type[BaseSettings]) -> CliSettingsSource:
    """pydantic-settings' command line for ``cls``, its flags in the groups of
    ``flags.flag_groups`` with their one-line help."""
    prog = cls.model_config.get("cli_prog_name")
    parser = argparse.ArgumentParser(prog=prog, usage=f"{prog} [flags]", formatter_class=_HelpFormatter,
                                     description=HELP_DESCRIPTION.get(prog))
    described: dict[str, tuple[argparse._ArgumentGroup, Flag]] = {}
    for group in flag_groups(cls):
        container = parser.add_argument_group(group.title, group.description or None)
        for flag in group.flags:
            described[flag.name] = (container, flag)

    def add_argument(container, *names: str, **kwargs):
        if container is parser and kwargs.get("dest") in described:
            container, flag = described[kwargs["dest"]]
            kwargs["help"] = flag.help.replace("%", "%%")
            if flag.metavar is not None and "metavar" in kwargs:
                kwargs["metavar"] = flag.metavar
        if kwargs.get("action") is argparse.BooleanOptionalAction:
            kwargs["action"] = _OnOff
        return container.add_argument(*names, **kwargs)

    source = CliSettingsSource(cls, root_parser=parser, add_argument_method=add_argument)
    # each group's flags in flag_groups' order (argparse lists them in the order they were added)
    order = {flag.name: i for i, (_, flag) in enumerate(described.values())}
    for container in parser._action_groups:
        container._group_actions.sort(key=lambda action: order.get(action.dest, -1))
    return source


def given_flags(cls, args: list[str]) -> set[str]:
    """The field names of ``cls`` set by flags in ``args`` (not by the environment); ``args``
    already parsed by ``parse_flags``. Every argument's default is argparse's ``SUPPRESS``
    there, so the namespace holds only what was given."""
    return set(vars(_cli_source(cls).root_parser.parse_args(args)))


def _problem(error: dict) -> str:
    """One validation error as a line: ``field: message``, or a check of several flags' message alone."""
    where = ".".join(map(str, error["loc"]))
    message = error["msg"].removeprefix("Value error, ")
    return f"{where}: {message}" if where else message


def parse_flags(cls, args: list[str]):
    """Settings of class ``cls`` from flags ``args`` + environment; a bad one is a one-line
    error and ``SystemExit(2)``."""
    try:
        return CliApp.run(cls, cli_args=args, cli_settings_source=_cli_source(cls))
    except ValidationError as exc:
        raise SystemExit(fail("; ".join(_problem(e) for e in exc.errors()), 2))
    except SettingsError as exc:
        raise SystemExit(fail(str(exc).splitlines()[0], 2))
