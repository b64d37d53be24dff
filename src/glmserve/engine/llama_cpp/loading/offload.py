"""GPU offload of a GGUF model's layers, with llama-server's flags and their meanings
(llama.cpp's ``common/arg.cpp``): ``--n-gpu-layers N|auto|all``, ``--split-mode``,
``--tensor-split``, ``--main-gpu``, ``--cpu-moe`` / ``--n-cpu-moe N`` (the expert tensors of all /
the first N layers kept in host memory: llama.cpp's ``LLM_FFN_EXPS_REGEX`` overrides),
``--override-tensor PATTERN=BUFFER``, ``--no-mmap``, ``--mlock``.

The devices are ggml's backend registry (``ggml_backend_dev_*`` in the ``libggml`` that
llama-cpp-python loads): a CPU build has the CPU alone, and offloads nothing whatever
``--n-gpu-layers`` says (llama.cpp accepts the parameter and ignores it), which ``Offload``
reports as 0 layers. ``auto`` (the default, as llama-server's) offloads as many layers as the
GPUs' free memory holds beside each layer's KV cache and a compute reserve; ``all`` every layer
and the output layer (llama.cpp counts n_layer + 1).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

import llama_cpp

from glmserve.engine.base import EngineError
from glmserve.engine.llama_cpp.loading.memory import KVPlan, plan_kv, read_header
from glmserve.engine.llama_cpp.settings import LlamaCppSettings

EXPERTS = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"  # llama.cpp's LLM_FFN_EXPS_REGEX
SPLIT_MODES = {"none": llama_cpp.LLAMA_SPLIT_MODE_NONE, "layer": llama_cpp.LLAMA_SPLIT_MODE_LAYER,
               "row": llama_cpp.LLAMA_SPLIT_MODE_ROW}
RESERVE = 512 << 20  # bytes per GPU kept for llama.cpp's compute buffers when fitting layers
_KINDS = {0: "CPU", 1: "GPU", 2: "IGPU", 3: "ACCEL"}  # ggml's enum ggml_backend_dev_type


class _TensorOverride(ctypes.Structure):  # llama.h's llama_model_tensor_buft_override
    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


def _ggml() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml.so"))  # the one llama_cpp loaded
    for name, res, args in [("ggml_backend_dev_count", ctypes.c_size_t, []),
                            ("ggml_backend_dev_get", ctypes.c_void_p, [ctypes.c_size_t]),
                            ("ggml_backend_dev_name", ctypes.c_char_p, [ctypes.c_void_p]),
                            ("ggml_backend_dev_description", ctypes.c_char_p, [ctypes.c_void_p]),
                            ("ggml_backend_dev_type", ctypes.c_int, [ctypes.c_void_p]),
                            ("ggml_backend_dev_memory", None, [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
                                                               ctypes.POINTER(ctypes.c_size_t)]),
                            ("ggml_backend_dev_buffer_type", ctypes.c_void_p, [ctypes.c_void_p]),
                            ("ggml_backend_buft_name", ctypes.c_char_p, [ctypes.c_void_p]),
                            ("ggml_backend_dev_backend_reg", ctypes.c_void_p, [ctypes.c_void_p]),
                            ("ggml_backend_reg_name", ctypes.c_char_p, [ctypes.c_void_p])]:
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return lib


@dataclass(frozen=True)
class Device:
    """One of ggml's devices: ``name`` (``CPU``, ``CUDA0``...), ``description``, ``kind`` (CPU, GPU,
    IGPU, ACCEL), ``backend`` (its registry: CPU, CUDA, Metal, Vulkan...), ``buffer`` (its buffer
    type's name, what ``--override-tensor`` names), ``free`` and ``total`` memory in bytes."""

    name: str
    description: str
    kind: str
    backend: str
    buffer: str
    free: int
    total: int


def devices() -> list[Device]:
    """The devices this build of llama.cpp has, in ggml's order."""
    lib, out = _ggml(), []
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        out.append(Device(lib.ggml_backend_dev_name(dev).decode(), lib.ggml_backend_dev_description(dev).decode(),
                          _KINDS.get(lib.ggml_backend_dev_type(dev), "?"),
                          lib.ggml_backend_reg_name(lib.ggml_backend_dev_backend_reg(dev)).decode(),
                          lib.ggml_backend_buft_name(lib.ggml_backend_dev_buffer_type(dev)).decode(),
                          free.value, total.value))
    return out


def _buffer_type(name: str) -> int:
    lib = _ggml()
    for i in range(lib.ggml_backend_dev_count()):
        buft = lib.ggml_backend_dev_buffer_type(lib.ggml_backend_dev_get(i))
        if lib.ggml_backend_buft_name(buft).decode() == name:
            return buft
    raise EngineError(f"--override-tensor: no buffer type {name!r} in this build of llama.cpp (it has: "
                      f"{', '.join(d.buffer for d in devices())})")


@dataclass(frozen=True)
class Offload:
    """What a model is loaded with: ``backend`` (the GPUs' backend, or CPU), ``devices`` (names),
    ``n_gpu_layers`` (layers offloaded, of ``n_layer`` + 1 with the output layer; 0 on a CPU build)
    and ``overrides`` ((pattern, buffer type name) pairs, in llama.cpp's order)."""

    backend: str
    devices: tuple[str, ...]
    n_gpu_layers: int
    n_layer: int
    overrides: tuple[tuple[str, str], ...]

    def describe(self) -> str:
        """One line for the start log."""
        kept = f"; tensors kept by pattern: {', '.join(f'{p}={b}' for p, b in self.overrides)}" if self.overrides else ""
        return (f"llama.cpp backend {self.backend} (devices: {', '.join(self.devices)}); {self.n_gpu_layers} of "
                f"{self.n_layer + 1} layers offloaded{kept}")


def overrides(settings: LlamaCppSettings, n_layer: int) -> list[tuple[str, str]]:
    """(pattern, buffer type name) of ``--override-tensor`` (in order), then ``--cpu-moe`` or
    ``--n-cpu-moe N`` (llama.cpp's ``llm_ffn_exps_cpu_override`` and
    ``llm_add_n_cpu_ffn_overrides``: the expert tensors to the ``CPU`` buffer type)."""
    out = [tuple(item.rsplit("=", 1)) for item in settings.override_tensor]
    if settings.cpu_moe:
        out.append((EXPERTS, "CPU"))
    out += [(rf"blk\.{i}{EXPERTS}", "CPU") for i in range(min(settings.n_cpu_moe or 0, n_layer))]
    return out


def plan_offload(settings: LlamaCppSettings, n_layer: int, weights: int, kv_bytes: int,
                 found: list[Device] | None = None) -> Offload:
    """``Offload`` of a model of ``n_layer`` layers, ``weights`` bytes and a KV cache of
    ``kv_bytes``, on ``found`` (default: ``devices()``). Raises ``EngineError`` for a
    ``--main-gpu`` or ``--tensor-split`` that names more GPUs than there are, or
    ``--batch-invariant`` with layers offloaded (measured on the CPU backend only)."""
    found = devices() if found is None else found
    gpus = [d for d in found if d.kind in ("GPU", "IGPU")]
    layers = n_layer + 1
    if not gpus or not llama_cpp.llama_supports_gpu_offload():
        n = 0
    elif settings.n_gpu_layers == "all":
        n = layers
    elif settings.n_gpu_layers == "auto":  # each layer's weights and KV cells, beside a compute reserve
        room = sum(max(d.free - RESERVE, 0) for d in gpus)
        n = min(layers, room // max(weights // layers + kv_bytes // max(n_layer, 1), 1))
    else:
        n = min(int(settings.n_gpu_layers), layers)
    if gpus and settings.main_gpu >= len(gpus):
        raise EngineError(f"--main-gpu {settings.main_gpu}: this machine has {len(gpus)} GPU(s)")
    if settings.tensor_split and len(settings.tensor_split) > max(len(gpus), 1):
        raise EngineError(f"--tensor-split gives {len(settings.tensor_split)} parts for {len(gpus)} GPU(s)")
    if n and settings.batch_invariant:
        raise EngineError(f"--batch-invariant is measured on llama.cpp's CPU backend only; with {n} layers on "
                          f"{gpus[0].backend}, give --n-gpu-layers 0 or drop --batch-invariant")
    backend = gpus[0].backend if n else "CPU"
    return Offload(backend, tuple(d.name for d in found), n, n_layer, tuple(overrides(settings, n_layer)))


def apply(params, settings: LlamaCppSettings, offload: Offload) -> list:
    """Set ``offload`` and ``settings``' load flags on llama.cpp's model ``params``; returns the
    arrays they point into (keep them alive until the model is loaded)."""
    params.n_gpu_layers = offload.n_gpu_layers
    params.split_mode = SPLIT_MODES[settings.split_mode]
    params.main_gpu = settings.main_gpu
    mmap = llama_cpp.LLAMA_LOAD_MODE_NONE if settings.no_mmap else llama_cpp.LLAMA_LOAD_MODE_MMAP
    if settings.mlock:
        mmap = llama_cpp.LLAMA_LOAD_MODE_MLOCK if settings.no_mmap else llama_cpp.LLAMA_LOAD_MODE_MMAP_MLOCK
    params.load_mode = mmap if (settings.no_mmap or settings.mlock) else params.load_mode
    keep: list = []
    if settings.tensor_split:
        split = (ctypes.c_float * llama_cpp.llama_max_devices())(*settings.tensor_split)
        params.tensor_split = ctypes.cast(split, ctypes.POINTER(ctypes.c_float))
        keep.append(split)
    if offload.overrides:
        array = (_TensorOverride * (len(offload.overrides) + 1))()  # the last, empty, ends the list
        for entry, (pattern, buffer) in zip(array, offload.overrides):
            entry.pattern, entry.buft = pattern.encode(), _buffer_type(buffer)
        params.tensor_buft_overrides = ctypes.cast(array, ctypes.c_void_p)
        keep.append(array)
    return keep



def offload_model(params, settings: LlamaCppSettings, path: Path) -> tuple[Offload, KVPlan | None, list]:
    """``plan_offload`` for the GGUF at ``path`` (its layers, file size and the KV cache
    ``memory.plan_kv`` gives it, from ``memory.read_header``) set on llama.cpp's model ``params``
    (``apply``); returns it, that KV plan (None when the header is not one ``read_header`` knows)
    and the arrays to keep alive until the model is loaded.
    Raises ``EngineError`` (``plan_offload``, ``plan_kv``, an unknown ``--override-tensor``
    buffer)."""
    header, weights = read_header(path), path.stat().st_size
    kv = None
    if header is not None:
        kv = plan_kv(settings, header.n_ctx_train, header.kv.bytes_per_cell(settings.cache_type_k,
                                                                             settings.cache_type_v), weights)
    offload = plan_offload(settings, header.n_layer if header else 0, weights, kv.bytes if kv else 0)
    return offload, kv, apply(params, settings, offload)
