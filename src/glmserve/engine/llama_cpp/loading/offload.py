"""GPU offload of a GGUF model's layers, with llama-server's flags and their meanings
(llama.cpp's ``common/arg.cpp``): ``--n-gpu-layers N|auto|all``, ``--split-mode``,
``--tensor-split``, ``--main-gpu``, ``--cpu-moe`` / ``--n-cpu-moe N`` (the expert tensors of all /
the first N layers kept in host memory: llama.cpp's ``LLM_FFN_EXPS_REGEX`` overrides),
``--override-tensor PATTERN=BUFFER``, ``--fit on|off``, ``--fit-target MiB``, ``--no-mmap``,
``--mlock``.

The devices are ggml's (``devices.py``), the ``--rpc`` servers' among them: a CPU build without
``--rpc`` has the CPU alone and offloads nothing whatever ``--n-gpu-layers`` says (llama.cpp
accepts the parameter and ignores it), which ``Offload`` reports as 0 layers. llama.cpp offloads
to the discrete GPUs (an integrated one only where there is none) and the RPC devices, these
first; with ``--split-mode none`` to ``--main-gpu`` alone. ``auto`` (the default, as
llama-server's) offloads as many layers as fit each device beside its margin (``fit.py``), and
for a mixture of experts that does not fit whole, keeps experts in host memory before whole
layers (``experts.py``; not where ``--cpu-moe``, ``--n-cpu-moe`` or ``--override-tensor`` place
them); with ``--fit off`` every layer, as ``all`` (llama.cpp counts n_layer + 1 with the output
layer).
"""

from __future__ import annotations

import ctypes
import dataclasses
from dataclasses import dataclass
from pathlib import Path

import llama_cpp

from glmserve.engine.base import EngineError
from glmserve.engine.llama_cpp.loading.devices import Device, buffer_type, devices
from glmserve.engine.llama_cpp.loading.experts import fill_experts, has_experts, held
from glmserve.engine.llama_cpp.loading.experts import overrides as partial_overrides
from glmserve.engine.llama_cpp.loading.fit import (MIB, DevicePlan, Devices, LayerBytes, fill_layers, fit_layers,
                                                   layer_bytes, place)
from glmserve.engine.llama_cpp.settings import LlamaCppSettings

EXPERTS = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"  # llama.cpp's LLM_FFN_EXPS_REGEX
SPLIT_MODES = {"none": llama_cpp.LLAMA_SPLIT_MODE_NONE, "layer": llama_cpp.LLAMA_SPLIT_MODE_LAYER,
               "row": llama_cpp.LLAMA_SPLIT_MODE_ROW}
COMPUTE = 512 * MIB  # bytes of compute buffer a device with layers is planned to hold


class _TensorOverride(ctypes.Structure):  # llama.h's llama_model_tensor_buft_override
    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


@dataclass(frozen=True)
class Offload:
    """What a model is loaded with: ``backend`` (the GPUs' backend, or CPU), ``devices`` (every
    device, ``Device.describe``), ``n_gpu_layers`` (layers offloaded, of ``n_layer`` + 1 with
    the output layer; 0 on a CPU build), ``overrides`` ((pattern, buffer type name) pairs, in
    llama.cpp's order), ``placement`` (what each GPU is planned to hold) and ``moved`` (the
    fit's own overrides: what the partial layers of a mixture-of-experts model keep off their
    device, ``experts.py``)."""

    backend: str
    devices: tuple[str, ...]
    n_gpu_layers: int
    n_layer: int
    overrides: tuple[tuple[str, str], ...]
    placement: tuple[DevicePlan, ...] = ()
    tensor_split: tuple[float, ...] = ()  # the fit's layers per GPU, where no --tensor-split was given
    moved: tuple[tuple[str, str], ...] = ()

    def describe(self) -> str:
        """The start log's lines: the devices, the layers offloaded, and each GPU's plan."""
        kept = f"; tensors kept by pattern: {', '.join(f'{p}={b}' for p, b in self.overrides)}" if self.overrides else ""
        return "\n".join([f"llama.cpp backend {self.backend} (devices: {', '.join(self.devices)}); {self.n_gpu_layers} of "
                          f"{self.n_layer + 1} layers offloaded{kept}", *(d.describe() for d in self.placement)])

    def failure(self) -> str:
        """What a failed load or context adds with layers offloaded (a device that ran out of
        memory fails llama.cpp's allocation), else ""."""
        if not self.n_gpu_layers:
            return ""
        held = ", ".join(f"{d.layers} on {d.name}" for d in self.placement if d.layers) or self.backend
        return (f" (layers offloaded: {held}; a device may be out of memory: lower --n-gpu-layers, or give auto to "
                f"fit them beside --fit-target)")


def draft_gpu_layers(settings: LlamaCppSettings, offload: Offload) -> int:
    """The draft model's layers on the GPUs (``--n-gpu-layers-draft``, llama-server's ``-ngld``):
    N, every one with ``all``, and with ``auto`` every one where the model's every layer is on
    the GPUs, else none (its room is the model's). Raises nothing."""
    asked = settings.n_gpu_layers_draft
    if asked == "auto":
        asked = "all" if offload.n_gpu_layers and offload.n_gpu_layers == offload.n_layer + 1 else 0
    return 1 << 30 if asked == "all" else int(asked)  # llama.cpp caps it at the draft's n_layer + 1


def offload_devices(settings: LlamaCppSettings, found: list[Device]) -> list[Device]:
    """The devices llama.cpp offloads to, in its order (``llama_model_load``): the RPC devices,
    then the discrete GPUs, or the integrated ones where there is no discrete GPU; with
    ``--split-mode none`` the ``--main-gpu`` of these alone. Raises ``EngineError`` for a
    ``--main-gpu`` past them."""
    rpc = [d for d in found if d.backend == "RPC"]
    local = [d for d in found if d.backend != "RPC" and d.kind == "GPU"] or \
        [d for d in found if d.backend != "RPC" and d.kind == "IGPU"]
    gpus = rpc + local
    if gpus and settings.main_gpu >= len(gpus):
        raise EngineError(f"--main-gpu {settings.main_gpu}: this machine has {len(gpus)} GPU(s)")
    return gpus[settings.main_gpu:settings.main_gpu + 1] if settings.split_mode == "none" and gpus else gpus


def overrides(settings: LlamaCppSettings, n_layer: int) -> list[tuple[str, str]]:
    """(pattern, buffer type name) of ``--override-tensor`` (in order), then ``--cpu-moe`` or
    ``--n-cpu-moe N`` (llama.cpp's ``llm_ffn_exps_cpu_override`` and
    ``llm_add_n_cpu_ffn_overrides``: the expert tensors to the ``CPU`` buffer type)."""
    out = [tuple(item.rsplit("=", 1)) for item in settings.override_tensor]
    if settings.cpu_moe:
        out.append((EXPERTS, "CPU"))
    out += [(rf"blk\.{i}{EXPERTS}", "CPU") for i in range(min(settings.n_cpu_moe or 0, n_layer))]
    return out


def plan_offload(settings: LlamaCppSettings, sizes: LayerBytes, kv_bytes: int,
                 found: list[Device] | None = None, compute: list[int] | None = None,
                 limit: int | None = None) -> Offload:
    """``Offload`` of a model whose tensors are ``sizes`` with a KV cache of ``kv_bytes``, on
    ``found`` (default: ``devices()``): ``--n-gpu-layers`` N or ``all``, or with ``auto`` what
    ``fit.fill_layers`` (``fit.fit_layers`` with a ``--tensor-split``) fits, at most ``limit``
    layers, or where a mixture of experts does not fit whole, ``experts.fill_experts``'s slots
    (every layer with ``--fit off``), each GPU keeping ``--fit-target`` MiB and holding
    ``compute[i]`` bytes of compute buffer (default: ``COMPUTE`` each). Raises
    ``EngineError`` for a ``--main-gpu`` or ``--tensor-split`` that names more GPUs than there
    are, or ``--batch-invariant`` with layers offloaded (measured on the CPU backend only)."""
    found = devices() if found is None else found
    gpus = offload_devices(settings, found)
    n_layer = len(sizes.layers)
    if settings.tensor_split and len(settings.tensor_split) > max(len(gpus), 1):
        raise EngineError(f"--tensor-split gives {len(settings.tensor_split)} parts for {len(gpus)} GPU(s)")
    shares = [float(x) for x in settings.tensor_split] + [0.0] * (len(gpus) - len(settings.tensor_split)) \
        if settings.tensor_split else [float(d.free) for d in gpus]
    plan = Devices([d.name for d in gpus], [d.free for d in gpus], shares, compute or [COMPUTE] * len(gpus),
                   settings.fit_target * MIB)
    kv_per_layer, split, placement, moved = kv_bytes // max(n_layer, 1), (), None, ()
    if not gpus:
        n = 0
    elif settings.n_gpu_layers == "auto" and settings.fit == "on" and not settings.tensor_split:
        split = tuple(float(c) for c in fill_layers(sizes, kv_per_layer, plan, limit))
        if sum(split) < n_layer + 1 and has_experts(sizes) and not overrides(settings, n_layer):
            slots = fill_experts(sizes, kv_per_layer, plan)  # experts to host memory before whole layers
            split, placement = tuple(float(s.n_layer) for s in slots), held(slots, sizes, kv_per_layer, plan)
            moved = tuple(partial_overrides(slots, n_layer, [d.buffer for d in gpus]))
        n, plan = int(sum(split)), dataclasses.replace(plan, shares=list(split))
    elif settings.n_gpu_layers == "auto" and settings.fit == "on":
        n = fit_layers(sizes, kv_per_layer, plan, limit)
    elif settings.n_gpu_layers in ("auto", "all"):
        n = n_layer + 1
    else:
        n = min(int(settings.n_gpu_layers), n_layer + 1)
    if n and settings.batch_invariant:
        raise EngineError(f"--batch-invariant is measured on llama.cpp's CPU backend only; with {n} layers on "
                          f"{gpus[0].backend}, give --n-gpu-layers 0 or drop --batch-invariant")
    if n and placement is None:
        placement = place(n, sizes, kv_per_layer, plan)
    return Offload(gpus[0].backend if n else "CPU", tuple(d.describe() for d in found), n, n_layer,
                   tuple(overrides(settings, n_layer)), tuple(placement or ()), split if n and len(gpus) > 1 else (),
                   moved if n else ())


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
    if settings.tensor_split or offload.tensor_split:
        split = (ctypes.c_float * llama_cpp.llama_max_devices())(*(settings.tensor_split or offload.tensor_split))
        params.tensor_split = ctypes.cast(split, ctypes.POINTER(ctypes.c_float))
        keep.append(split)
    kept = offload.overrides + offload.moved
    if kept:
        array = (_TensorOverride * (len(kept) + 1))()  # the last, empty, ends the list
        for entry, (pattern, buffer) in zip(array, kept):
            entry.pattern, entry.buft = pattern.encode(), buffer_type(buffer)
        params.tensor_buft_overrides = ctypes.cast(array, ctypes.c_void_p)
        keep.append(array)
    return keep
