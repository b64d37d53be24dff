"""llama.cpp's own dry run of a load (``llama_model_params.no_alloc``, as llama-server's ``--fit``
runs it in ``common/fit.cpp``): the model and its context are created without allocating
anything, and llama.cpp reports the compute buffer each device would hold (its scheduler's
reservation for the largest batch, which depends on the layers each device holds, the context,
the micro-batch and the vocabulary) and the size of the KV cache. llama-cpp-python reaches the
dry run but not llama.cpp's C++ memory breakdown, so the sizes are read from the lines llama.cpp
logs during it (``sched_reserve: NAME compute buffer size = X MiB``, ``llama-context.cpp``;
``llama_kv_cache: size = X MiB``, ``llama-kv-cache.cpp``; the per-device weights and KV buffers
it logs are 0 in a dry run).
"""

from __future__ import annotations

import ctypes
import re
import threading
from dataclasses import dataclass
from pathlib import Path

import llama_cpp
from llama_cpp import _logger

_COMPUTE = re.compile(r"(\S+) compute buffer size = +([\d.]+) MiB")
_KV = re.compile(r"llama_kv_cache: size = +([\d.]+) MiB")
_lock = threading.Lock()  # llama.cpp's logger is the process's: one dry run at a time


@dataclass(frozen=True)
class DryRun:
    """What a dry run reports: ``compute`` bytes of compute buffer in each buffer type (by name,
    ``Device.buffer``) and ``kv`` bytes of KV cache in all (each cache's: a model with
    sliding-window layers has two)."""

    compute: dict[str, int]
    kv: int


def dry_run(path: Path, model_params, context_params) -> DryRun | None:
    """``DryRun`` of loading the GGUF at ``path`` with ``model_params`` (copied; the arrays it
    points into must be alive) and creating a context with ``context_params``. None when the
    dry run fails (llama.cpp then reports why at the real load)."""
    lines: list[str] = []

    @llama_cpp.llama_log_callback
    def capture(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        lines.append(text.decode("utf-8", "replace"))

    params = llama_cpp.llama_model_params.from_buffer_copy(model_params)
    params.no_alloc = True
    params.load_mode = llama_cpp.LLAMA_LOAD_MODE_NONE  # as common/fit.cpp: a dry run maps nothing
    with _lock:
        llama_cpp.llama_log_set(capture, ctypes.c_void_p(0))
        try:
            model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
            if not model:
                return None
            try:
                ctx = llama_cpp.llama_init_from_model(model, context_params)
                if not ctx:
                    return None
                llama_cpp.llama_free(ctx)
            finally:
                llama_cpp.llama_model_free(model)
        finally:
            llama_cpp.llama_log_set(_logger.llama_log_callback, ctypes.c_void_p(0))
    text, found = "".join(lines), {}
    for match in _COMPUTE.finditer(text):  # reserved again for each graph it is sized for: the largest holds
        found[match.group(1)] = max(found.get(match.group(1), 0), int(float(match.group(2)) * 2**20))
    return DryRun(found, sum(int(float(mib) * 2**20) for mib in _KV.findall(text)))
