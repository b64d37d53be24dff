"""The models of a server of several: found in ``--models-dir`` folders and declared in a
``--config`` file, each with the settings it is served with.

- ``--models-dir DIR``: every ``.gguf`` file (llama_cpp) and every Hugging Face model folder (a
  folder with ``config.json``; the transformers engine unless ``--engine vllm``) under DIR,
  named by its path below DIR without ``.gguf`` (``glm-4-9b-chat.Q4_K_M``, ``org/model``); a
  split GGUF (``NAME-00001-of-00003.gguf`` ...) is one model, ``NAME``, loaded from its first
  shard.
  Multimodal projector files (``mmproj*``) are skipped, as llama-server's router skips them.
- ``--config FILE`` (YAML or JSON): server settings (``port``, ``api_key``, ``max_loaded_models``,
  ...: ``ServerSettings`` fields; a flag or ``GLMSERVE_*`` variable given wins) beside
  ``{"models": [{"name", "model", "aliases", "keep_alive",
  "embedding", ...}]}`` (``embedding: true``: served for ``/v1/embeddings`` only; generation
  routes refuse it with a 400); the other keys of an entry are ``glmserve serve``'s flags as they are named in its
  settings (``engine``, ``n_ctx``, ``n_threads``, ``chat_template``, ``tool_call_parser``,
  ``lora``, ...), for that model only. Server-wide flags (``port``, ``api_key``, ...) are refused
  in an entry. Each entry is validated by pydantic as a ``ConfigEntry``, its settings as
  ``ModelSettings`` with what the model inherits (``runtime.start.model_settings``), all at
  start-up.

``keep_alive`` follows Ollama: a number of seconds or a duration (``"90s"``, ``"5m"``,
``"1h30m"``); 0 unloads a model right after its reply; a negative value keeps it loaded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError, field_validator, model_validator

from glmserve.engine.settings import per_model_fields
from glmserve.models.keep_alive import parse_keep_alive
from glmserve.models.resolve import gguf_name
from glmserve.settings.model import ModelSettings
from glmserve.settings.serve import DeploySettings
from glmserve.settings.server import ServerSettings

# the settings that belong to the server, never to one model of it: ServerSettings' fields and
# where the app runs (DeploySettings' own)
SERVER_WIDE = frozenset(DeploySettings.model_fields) - frozenset(ModelSettings.model_fields)
# the settings that are one model's own (PER_MODEL): given as flags they are --model's own, and a
# --config entry gives its own; every other model setting (the engine's: threads, context,
# batching, memory; the request limits) is a default each model inherits unless its entry says
# otherwise
OWN_FIELDS = per_model_fields(ModelSettings)


class ConfigError(ValueError):
    """A ``--config`` file or ``--models-dir`` that cannot be served; one line for the user."""


@dataclass(frozen=True, slots=True)
class ModelEntry:
    """One servable model: ``name`` (what requests send as ``model``), ``fields``: its settings
    (``model``: the path; ``engine``; any per-model flag), ``aliases``, ``keep_alive`` in
    seconds (None: the server's ``--keep-alive``; ``math.inf``: keep loaded)."""

    name: str
    fields: dict[str, Any] = field(default_factory=dict)
    aliases: tuple[str, ...] = ()
    keep_alive: float | None = None
    embedding: bool = False  # served for embeddings only


def scan_models_dir(folder: Path, hf_engine: str = "transformers") -> list[ModelEntry]:
    """The models under ``folder`` (see module docstring), sorted by name. Raises
    ``ConfigError`` when ``folder`` is not a folder."""
    if not folder.is_dir():
        raise ConfigError(f"--models-dir {folder}: not a folder")
    entries: dict[str, ModelEntry] = {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if any(part.startswith(".") for part in rel.parts):
            continue
        if path.is_file() and path.suffix == ".gguf" and not path.name.startswith("mmproj"):
            stem = gguf_name(path)
            if stem is None:
                continue  # a later shard of a split GGUF: served as one model with its first
            name = (rel.parent / stem).as_posix()
            entries[name] = ModelEntry(name, {"model": str(path), "engine": "llama_cpp"})
        elif path.is_dir() and (path / "config.json").is_file():
            name = rel.as_posix()
            entries[name] = ModelEntry(name, {"model": str(path), "engine": hf_engine})
    return [entries[name] for name in sorted(entries)]


def _load(path: Path) -> dict[str, Any]:
    """The mapping ``path`` holds (YAML or JSON), with its ``models`` list. Raises ``ConfigError``."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"--config {path}: {exc.strerror or exc}") from exc
    try:
        if path.suffix == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as exc:  # json and yaml raise their own errors
        raise ConfigError(f"--config {path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: "
                          f"{' '.join(str(exc).split())[:200]}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("models"), list):
        raise ConfigError(f"--config {path}: expected a mapping with a 'models' list")
    return data


def server_settings(path: Path) -> dict[str, Any]:
    """The server settings ``path`` gives beside its ``models`` (``ServerSettings`` fields, as
    llama-cpp-python's config file holds ``ServerSettings`` beside ``models``), validated.
    Raises ``ConfigError`` for a key that is not a server setting (a model's settings go in its
    entry) or a bad value."""
    values = {k: v for k, v in _load(path).items() if k != "models"}
    unknown = sorted(set(values) - (set(ServerSettings.model_fields) - {"config"}))
    if unknown:
        raise ConfigError(f"--config {path}: {', '.join(unknown)}: not a server setting (a model's settings go "
                          "in its entry under models)")
    try:
        checked = ServerSettings.model_validate(values)
    except ValidationError as exc:
        raise ConfigError(f"--config {path}: " + "; ".join(
            f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())) from None
    return {name: getattr(checked, name) for name in values}


def with_server_settings(settings: DeploySettings) -> DeploySettings:
    """``settings`` with the server settings of its ``--config`` file where no flag or
    ``GLMSERVE_*`` variable gave them. Raises ``ConfigError``."""
    if not settings.config:
        return settings
    given = server_settings(Path(settings.config).expanduser())
    return settings.model_copy(update={k: v for k, v in given.items() if k not in settings.model_fields_set})


class ConfigEntry(BaseModel):
    """One entry of a ``--config`` file's ``models`` list, as pydantic validates it: ``name``
    and ``model`` (required), ``aliases``, ``keep_alive`` (a duration, in seconds once read),
    ``embedding``; every other key is a ``ModelSettings`` field for this model alone (validated
    as ``ModelSettings`` with what the model inherits, ``runtime.start.model_settings``). Refused:
    a server-wide setting, ``served_model_name`` (the entry's ``name`` is the model's id) and a
    key that is not a model setting."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1)
    model: str = Field(min_length=1)
    aliases: list[Annotated[str, Field(min_length=1)]] = []
    keep_alive: float | None = None
    embedding: StrictBool = False

    @field_validator("keep_alive", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> float | None:
        return None if value is None else parse_keep_alive(value)

    @model_validator(mode="after")
    def _settings(self) -> ConfigEntry:
        given = set(self.model_extra or {})
        if "served_model_name" in given:
            raise ValueError("served_model_name: the entry's name is the model's id")
        server_wide = sorted(given & SERVER_WIDE)
        if server_wide:
            raise ValueError(f"{', '.join(server_wide)} applies to the whole server, not one model")
        unknown = sorted(given - set(ModelSettings.model_fields))
        if unknown:
            raise ValueError(f"{', '.join(unknown)}: not a model setting (glmserve serve --help lists them)")
        return self

    def entry(self) -> ModelEntry:
        """The ``ModelEntry`` of this entry: its settings are ``model`` and the other keys."""
        return ModelEntry(self.name, {"model": self.model, **(self.model_extra or {})}, tuple(self.aliases),
                          self.keep_alive, self.embedding)


def read_config(path: Path) -> list[ModelEntry]:
    """The models declared in ``path`` (YAML or JSON), each validated as a ``ConfigEntry``.
    Raises ``ConfigError`` naming the entry and the key."""
    entries = []
    for i, item in enumerate(_load(path)["models"]):
        name = item.get("name") if isinstance(item, dict) else None
        where = f"--config {path}: models[{i}]" + (f" ({name})" if isinstance(name, str) and name else "")
        try:
            entries.append(ConfigEntry.model_validate(item).entry())
        except ValidationError as exc:
            raise ConfigError(f"{where}: " + "; ".join(_error_text(e) for e in exc.errors())) from None
    return entries


def _error_text(error: Any) -> str:
    """One pydantic error as a line: its key (none for a whole entry) and its message."""
    key = ".".join(map(str, error["loc"]))
    message = error["msg"].removeprefix("Value error, ").removeprefix(f"{key}: ")
    return f"{key}: {message}" if key else message
