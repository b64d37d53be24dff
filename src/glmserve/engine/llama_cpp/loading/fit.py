"""How many layers of a GGUF model fit the GPUs, device by device, as llama-server's ``--fit``
decides it (llama.cpp's ``common/fit.cpp``): each device keeps a margin free (``--fit-target``
MiB, 1024 by default as llama-server's) and must hold, for the layers llama.cpp gives it, their
weights (read from the GGUF's tensor table, every shard, less the tensors ``--override-tensor``,
``--cpu-moe`` or ``--n-cpu-moe`` keep in host memory), their KV cells and a compute buffer.

Which layers go where follows llama.cpp's ``llama_model::load_tensors``: the last ``n`` of the
``n_layer + 1`` layers (the output layer last) are offloaded, and layer ``il`` goes to the first
device whose cumulative share passes ``(il - first) / n``. Without ``--tensor-split`` the fit
fills the devices back to front and passes the counts as the split, as llama-server's ``--fit``
does (``fill_layers``); a ``--tensor-split`` given is kept, and the fit finds the most layers
those shares place within every device (``fit_layers``).
"""

from __future__ import annotations

import bisect
import ctypes
import re
from dataclasses import dataclass
from pathlib import Path

from glmserve.models import gguf_shards

MIB = 1 << 20
_LAYER = re.compile(r"^blk\.(\d+)\.")
# tensors of the output layer (llama.cpp's LLM_TENSOR_OUTPUT, _OUTPUT_NORM): offloaded as layer n_layer
_OUTPUT = ("output.weight", "output_norm.weight", "output_norm.bias", "output.bias")
# what a partial layer of a mixture-of-experts model keeps off its device (after ``blk\.N``):
# ``common/fit.cpp``'s LAYER_FRACTION_* patterns (MOE: the experts; ATTN: the whole feed-forward
# part; UP: all of it but the up projections; GATE: the down projections), searched as llama.cpp does
FRACTIONS = {"moe": r"\.ffn_(up|down|gate_up|gate)_(ch|)exps", "attn": r"\.ffn_(gate|up|gate_up|down).*",
             "up": r"\.ffn_(gate|gate_up|down).*", "gate": r"\.ffn_down.*"}


@dataclass(frozen=True)
class LayerBytes:
    """Bytes of a model's tensors by where they may go: ``layers[i]`` of repeating layer ``i``
    on its device, ``output`` of the output layer, ``host`` kept in host memory whatever is
    offloaded (the token embeddings, tensors an override keeps on the CPU); ``moved[i]``: of
    ``layers[i]``, the bytes each of ``FRACTIONS`` matches (none for a layer without them)."""

    layers: tuple[int, ...]
    output: int
    host: int
    moved: tuple[dict[str, int], ...] = ()

    @classmethod
    def even(cls, n_layer: int, weights: int) -> LayerBytes:
        """``weights`` split evenly over the ``n_layer + 1`` layers (a GGUF whose tensor table
        cannot be read)."""
        each = weights // (n_layer + 1)
        return cls((each,) * n_layer, each, 0)


class _GGUFInit(ctypes.Structure):  # gguf.h's gguf_init_params
    _fields_ = [("no_alloc", ctypes.c_bool), ("ctx", ctypes.c_void_p)]


def tensor_sizes(path: Path) -> dict[str, int]:
    """Bytes of each tensor of the GGUF file at ``path``, from its header alone (ggml's
    ``gguf_init_from_file`` with ``no_alloc``, in the libggml llama.cpp uses: milliseconds, where
    gguf-py's reader parses the whole vocabulary in Python). Raises ``OSError`` for a file ggml
    cannot read."""
    from glmserve.engine.llama_cpp.loading.devices import ggml

    lib = ggml()
    lib.gguf_init_from_file.restype, lib.gguf_init_from_file.argtypes = ctypes.c_void_p, [ctypes.c_char_p, _GGUFInit]
    for name, res in (("gguf_get_n_tensors", ctypes.c_int64), ("gguf_free", None)):
        getattr(lib, name).restype, getattr(lib, name).argtypes = res, [ctypes.c_void_p]
    for name, res in (("gguf_get_tensor_name", ctypes.c_char_p), ("gguf_get_tensor_size", ctypes.c_size_t)):
        getattr(lib, name).restype, getattr(lib, name).argtypes = res, [ctypes.c_void_p, ctypes.c_int64]
    ctx = lib.gguf_init_from_file(str(path).encode(), _GGUFInit(True, None))
    if not ctx:
        raise OSError(f"ggml cannot read the GGUF header of {path}")
    try:
        return {lib.gguf_get_tensor_name(ctx, i).decode(): lib.gguf_get_tensor_size(ctx, i)
                for i in range(lib.gguf_get_n_tensors(ctx))}
    finally:
        lib.gguf_free(ctx)


def layer_bytes(path: Path, n_layer: int, host_patterns: list[str]) -> LayerBytes | None:
    """``LayerBytes`` of the GGUF at ``path`` (every shard's tensor table, ``tensor_sizes``), a
    tensor whose name matches one of ``host_patterns`` (regular expressions, searched as llama.cpp
    does) counted as host memory. A model whose output layer reuses the token embeddings (no
    ``output.weight``: tied embeddings) gets a copy of them there, as llama.cpp makes one. None
    when a shard cannot be read."""
    layers, output, host = [0] * n_layer, 0, 0
    moved: list[dict[str, int]] = [{} for _ in range(n_layer)]
    kept = [re.compile(p) for p in host_patterns]
    names: dict[str, int] = {}
    try:
        for shard in gguf_shards(path):
            names.update(tensor_sizes(shard))
    except OSError:
        return None
    for name, size in names.items():
        layer = _LAYER.match(name)
        if any(p.search(name) for p in kept) or (layer is None and name not in _OUTPUT):
            host += size
        elif layer is None:
            output += size
        elif int(layer.group(1)) < n_layer:
            il = int(layer.group(1))
            layers[il] += size
            for fraction, pattern in FRACTIONS.items():
                if re.search(pattern, name):
                    moved[il][fraction] = moved[il].get(fraction, 0) + size
        else:  # NextN (MTP) layers past n_layer: llama.cpp places them with the output layer
            output += size
    if "output.weight" not in names:
        output += names.get("token_embd.weight", 0)
    return LayerBytes(tuple(layers), output, host, tuple(moved))


def assign_layers(n: int, n_layer: int, shares: list[float]) -> list[list[int]]:
    """The layers (0..n_layer, n_layer the output layer) each of the devices with ``shares``
    holds when ``n`` layers are offloaded (module docstring)."""
    out: list[list[int]] = [[] for _ in shares]
    n = min(n, n_layer + 1)
    total = sum(shares)
    if not n or not shares or total <= 0:
        return out
    cumulative, acc = [], 0.0
    for share in shares:
        acc += share
        cumulative.append(acc / total)
    first = n_layer + 1 - n
    for il in range(first, n_layer + 1):
        device = min(bisect.bisect_right(cumulative, (il - first) / n), len(shares) - 1)
        out[device].append(il)
    return out


@dataclass(frozen=True)
class DevicePlan:
    """What one device holds with a plan: ``layers`` (their count; ``partial`` of them with
    their experts in host memory, ``experts.py``), ``weights``, ``kv`` and ``compute`` bytes,
    beside its ``free`` memory and the ``margin`` to keep."""

    name: str
    layers: int
    weights: int
    kv: int
    compute: int
    free: int
    margin: int
    partial: int = 0

    @property
    def used(self) -> int:
        return self.weights + self.kv + self.compute

    @property
    def fits(self) -> bool:
        return self.used + self.margin <= self.free

    def describe(self) -> str:
        """llama-server's memory breakdown, one device: ``NAME: L layers (P with experts in host
        memory), weights W + KV K + compute C MiB of F MiB free``."""
        partial = f" ({self.partial} with experts in host memory)" if self.partial else ""
        return (f"{self.name}: {self.layers} layers{partial}, weights {self.weights // MIB} + KV {self.kv // MIB} + "
                f"compute {self.compute // MIB} MiB of {self.free // MIB} MiB free (margin {self.margin // MIB} MiB)")


@dataclass(frozen=True)
class Devices:
    """The GPUs a model is offloaded to, in llama.cpp's order: ``names``, ``free`` bytes each,
    ``shares`` (``--tensor-split``'s, else each one's free memory), ``compute`` (bytes of compute
    buffer each holds when it holds layers) and the ``margin`` each keeps free."""

    names: list[str]
    free: list[int]
    shares: list[float]
    compute: list[int]
    margin: int


def place(n: int, sizes: LayerBytes, kv_per_layer: int, gpus: Devices) -> list[DevicePlan]:
    """``DevicePlan`` of each of ``gpus`` with ``n`` layers offloaded (``assign_layers``)."""
    n_layer = len(sizes.layers)
    out = []
    for name, room, compute, held in zip(gpus.names, gpus.free, gpus.compute, assign_layers(n, n_layer, gpus.shares)):
        weights = sum(sizes.output if il == n_layer else sizes.layers[il] for il in held)
        repeating = sum(1 for il in held if il < n_layer)
        out.append(DevicePlan(name, len(held), weights, repeating * kv_per_layer, compute if held else 0, room,
                              gpus.margin))
    return out


def fill_layers(sizes: LayerBytes, kv_per_layer: int, gpus: Devices, limit: int | None = None) -> list[int]:
    """Layers per device, filled back to front as ``common/fit.cpp`` fills dense layers: the last
    device takes the output layer and the layers before it while they fit beside its compute
    buffer and margin, then the device before it the layers before those, and so on. The counts
    are the ``--tensor-split`` llama.cpp is then given (``assign_layers`` gives each device its
    count). ``limit``: at most that many layers in all."""
    n_layer, counts, il = len(sizes.layers), [0] * len(gpus.names), len(sizes.layers)
    last = n_layer - (n_layer + 1 if limit is None else limit)  # the lowest layer that may be offloaded, less one
    for device in range(len(gpus.names) - 1, -1, -1):
        used = gpus.compute[device] + gpus.margin
        while il > last:
            cost = sizes.output if il == n_layer else sizes.layers[il] + kv_per_layer
            if used + cost > gpus.free[device]:
                break
            used, counts[device], il = used + cost, counts[device] + 1, il - 1
        if counts[device] == 0 and il == n_layer:  # the output layer does not fit the last device: none offloaded
            return [0] * len(counts)
    return counts


def fit_layers(sizes: LayerBytes, kv_per_layer: int, gpus: Devices, limit: int | None = None) -> int:
    """The most layers (of ``n_layer + 1``, at most ``limit``) whose ``place`` with
    ``gpus.shares`` fits every device (0 when none does)."""
    for n in range(min(len(sizes.layers) + 1, len(sizes.layers) + 1 if limit is None else limit), 0, -1):
        if all(device.fits for device in place(n, sizes, kv_per_layer, gpus)):
            return n
    return 0
