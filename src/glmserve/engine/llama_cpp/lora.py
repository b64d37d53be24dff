"""GGUF LoRA adapters of one llama.cpp model (``--lora NAME=FILE.gguf`` and run-time loads):
loading (llama.cpp checks architecture and tensor shapes), freeing, and which one the context
applies. llama.cpp applies adapters to a whole context, so the engine serves one adapter group per
step and switches the context's adapter between steps (``use``). Worker thread only."""

from __future__ import annotations

import ctypes
import logging
from pathlib import Path

import llama_cpp
from llama_cpp._utils import suppress_stdout_stderr

from glmserve.engine.base import LoRAAdapterError

log = logging.getLogger("glmserve.engine.llama_cpp")


class GGUFAdapters:
    """The adapters of ``model`` (a ``llama_model`` pointer); ``ctx`` is set once the context exists."""

    def __init__(self, model: ctypes.c_void_p) -> None:
        self.model = model
        self.ctx = None
        self._adapters: dict[str, ctypes.c_void_p] = {}
        self.active: str | None = None  # the adapter the context applies (None: none)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._adapters)

    def __contains__(self, name: object) -> bool:
        return name in self._adapters

    def load(self, name: str, path: str | Path) -> None:
        """Load the GGUF adapter at ``path`` as ``name``. Raises ``LoRAAdapterError``."""
        reason = None
        if not Path(path).is_file():
            reason = "no such file"
        else:
            with suppress_stdout_stderr(disable=False):
                adapter = llama_cpp.llama_adapter_lora_init(self.model, str(path).encode())
            if not adapter:
                reason = ("does not match the base model, or is not a GGUF LoRA adapter (llama.cpp checks "
                          "the architecture and tensor shapes)")
        if reason is not None:
            raise LoRAAdapterError(f"LoRA adapter {name!r} ({path}): {reason}")
        log.info("LoRA adapter %s loaded from %s", name, path)
        self._adapters[name] = adapter

    def free(self, name: str) -> None:
        """Free adapter ``name`` (the context stops applying it first)."""
        if self.active == name:
            self.use(None)
        adapter = self._adapters.pop(name, None)
        if adapter is not None:
            llama_cpp.llama_adapter_lora_free(adapter)
            log.info("LoRA adapter %s unloaded", name)

    def forget(self) -> None:
        """Drop every handle without freeing it (llama.cpp frees a model's adapters with it)."""
        self._adapters.clear()

    def use(self, group: str | None) -> None:
        """Apply ``group``'s adapter (None: none) to the context, if it is not applied yet."""
        if group == self.active:
            return
        with suppress_stdout_stderr(disable=False):  # llama.cpp logs the graph it reserves anew
            if group is None:
                rc = llama_cpp.llama_set_adapters_lora(self.ctx, None, 0, None)
            else:
                adapters = (llama_cpp.llama_adapter_lora_p_ctypes * 1)(self._adapters[group])
                rc = llama_cpp.llama_set_adapters_lora(self.ctx, adapters, 1, (ctypes.c_float * 1)(1.0))
        if rc != 0:
            raise RuntimeError(f"llama_set_adapters_lora failed ({rc})")
        self.active = group
