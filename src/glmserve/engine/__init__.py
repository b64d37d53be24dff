"""Engines behind one interface; each engine is a subpackage imported lazily by name."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from glmserve.engine.base import Engine, EngineError, EngineOverloaded, GrammarError, Tokenizer
from glmserve.engine.types import GenerationOutput, GenerationRequest, ModelInfo, SamplingParams

if TYPE_CHECKING:
    from glmserve.settings import ServeSettings

ENGINES = {"llama_cpp": "glmserve.engine.llama_cpp", "transformers": "glmserve.engine.transformers"}
INSTALL_HINTS = {"transformers": "pip install 'glmserve[transformers]'"}


def create_engine(settings: ServeSettings) -> Engine:
    """Import the engine named by ``settings.engine`` and build it (not started).

    Raises ``EngineError`` for an unknown engine or one whose optional dependencies are missing.
    """
    module_name = ENGINES.get(settings.engine)
    if module_name is None:
        raise EngineError(f"unknown engine {settings.engine!r}; choose one of {sorted(ENGINES)}")
    try:
        return importlib.import_module(module_name).build(settings)
    except ImportError as exc:
        hint = INSTALL_HINTS.get(settings.engine)
        raise EngineError(f"engine {settings.engine!r} needs {exc.name or exc}, which is not installed"
                          + (f" ({hint})" if hint else "")) from exc


__all__ = [
    "ENGINES",
    "Engine",
    "EngineError",
    "EngineOverloaded",
    "GrammarError",
    "GenerationOutput",
    "GenerationRequest",
    "ModelInfo",
    "SamplingParams",
    "Tokenizer",
    "create_engine",
]
