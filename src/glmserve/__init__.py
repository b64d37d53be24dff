"""glmserve: a self-hosted, OpenAI-compatible server for GLM-family (and any other) chat models."""

from __future__ import annotations

from typing import TYPE_CHECKING

from glmserve.version import __version__

if TYPE_CHECKING:
    from glmserve.llm import LLM


def __getattr__(name: str):
    if name == "LLM":  # lazy: importing glmserve must not load an engine
        from glmserve.llm import LLM

        return LLM
    raise AttributeError(name)


__all__ = ["LLM", "__version__"]
