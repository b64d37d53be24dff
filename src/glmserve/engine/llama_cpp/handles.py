"""Releasing llama.cpp handles: a ``llama_batch``, a context and a model, in that order (a
context before the model it was created from)."""

from __future__ import annotations

import llama_cpp
from llama_cpp._utils import suppress_stdout_stderr


def free_handles(batch=None, ctx=None, model=None) -> None:
    """Free whichever of ``batch`` (``llama_batch_init``), ``ctx`` (``llama_init_from_model``)
    and ``model`` (a ``LlamaModel``) are not None; llama.cpp's messages while freeing are hidden."""
    if batch is not None:
        llama_cpp.llama_batch_free(batch)
    if ctx:
        with suppress_stdout_stderr(disable=False):
            llama_cpp.llama_free(ctx)
    if model is not None:
        model.close()
