"""Expert tensors to host memory before whole layers leave the GPUs: how llama-server's ``--fit``
places a mixture-of-experts model that does not fit the devices whole (llama.cpp's
``common/fit.cpp``, ``common_params_fit_impl`` steps 3 and 4).

Each device holds ``Slot.n_layer`` consecutive layers, of which the first ``n_full`` are whole
and the ``n_part`` after them partial: their expert tensors (``FRACTIONS["moe"]``) kept in host
memory. The first partial layer of a device may keep more or less of its feed-forward part there
(``overflow``: ``attn`` keeps all of it, ``up`` all but the up projections, ``gate`` the down
projections alone), in host memory or, before the last device, on the next device.

1. Dense-only layers are filled back to front: the last device takes the output layer and as
   many partial layers before it as fit, then the device before it, and so on (as for a dense
   model, but with the experts in host memory; llama.cpp counts the lowest layer of the last
   device whole, and so does this).
2. Where every layer fits that way with memory to spare, partial layers are made whole front to
   back, device by device, while they fit; then the next layer is made part-whole with the
   largest ``overflow`` that fits.

llama.cpp measures each candidate with a dry run; here a candidate's bytes are the tensors'
(``fit.LayerBytes``) with the KV cells and the compute buffers measured once (``offload.py``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from glmserve.engine.llama_cpp.loading.fit import FRACTIONS, DevicePlan, Devices, LayerBytes, assign_layers


@dataclass(frozen=True)
class Slot:
    """One device's layers (llama.cpp's ``ngl_t``): ``n_layer`` in all, the last ``n_part`` of
    them partial, the first of these keeping ``overflow`` (a ``FRACTIONS`` key) off the device,
    on the next device where ``spill`` (else in host memory)."""

    n_layer: int = 0
    n_part: int = 0
    overflow: str = "moe"
    spill: bool = False

    @property
    def n_full(self) -> int:
        return self.n_layer - self.n_part


def layer_pattern(il: int, fraction: str) -> str:
    """The ``--override-tensor`` pattern of layer ``il``'s ``fraction`` (``FRACTIONS``)."""
    return rf"blk\.{il}" + FRACTIONS[fraction]


def has_experts(sizes: LayerBytes) -> bool:
    """Whether the model has expert tensors its layers may keep in host memory."""
    return any(moved.get("moe") for moved in sizes.moved)


def held(slots: list[Slot], sizes: LayerBytes, kv_per_layer: int, gpus: Devices) -> list[DevicePlan]:
    """``DevicePlan`` of each of ``gpus`` holding ``slots``: the last ``sum(n_layer)`` of the
    ``n_layer + 1`` layers, device after device; a partial layer's weights less what it keeps off
    the device (added to the next device's where it spills there)."""
    n_layer = len(sizes.layers)
    weights, kv = [0] * len(slots), [0] * len(slots)
    il = n_layer + 1 - sum(s.n_layer for s in slots)
    for d, slot in enumerate(slots):
        for k in range(slot.n_layer):
            if il == n_layer:
                weights[d] += sizes.output
            else:
                fraction = None if k < slot.n_full else slot.overflow if k == slot.n_full else "moe"
                moved = sizes.moved[il].get(fraction, 0) if fraction and sizes.moved else 0
                weights[d] += sizes.layers[il] - moved
                if fraction and k == slot.n_full and slot.spill and d + 1 < len(slots):
                    weights[d + 1] += moved
                kv[d] += kv_per_layer
            il += 1
    return [DevicePlan(name, s.n_layer, w, c, compute if s.n_layer else 0, free, gpus.margin, s.n_part)
            for name, s, w, c, compute, free in zip(gpus.names, slots, weights, kv, gpus.compute, gpus.free)]


def overrides(slots: list[Slot], n_layer: int, buffers: list[str]) -> list[tuple[str, str]]:
    """(pattern, buffer type name) of ``slots``' partial layers (llama.cpp's
    ``set_ngl_tensor_split_tbo``): a device's first partial layer keeps its ``overflow`` on
    the next device's buffer type (``buffers[d + 1]``) where it spills, else ``CPU``; the others
    keep their experts on ``CPU``."""
    out, il = [], n_layer + 1 - sum(s.n_layer for s in slots)
    for d, slot in enumerate(slots):
        il += slot.n_full
        for k in range(slot.n_part):
            first = k == 0
            out.append((layer_pattern(il + k, slot.overflow if first else "moe"),
                        buffers[d + 1] if first and slot.spill else "CPU"))
        il += slot.n_part
    return out


def fill_experts(sizes: LayerBytes, kv_per_layer: int, gpus: Devices) -> list[Slot]:
    """The slots of a mixture-of-experts model that does not fit ``gpus`` whole (module
    docstring): never every layer whole (the caller found that does not fit)."""
    nd, every = len(gpus.names), len(sizes.layers) + 1

    def fits(test: list[Slot], d: int, strict: bool = False) -> bool:
        plan = held(test, sizes, kv_per_layer, gpus)[d]
        return plan.used < plan.free - plan.margin if strict else plan.fits

    slots = [Slot() for _ in range(nd)]
    for d in range(nd - 1, -1, -1):  # 1. dense-only layers, back to front
        unassigned = every - sum(s.n_layer for s in slots[d + 1:])
        tests = [_with(slots, d, Slot(k, k if d < nd - 1 else k - 1)) for k in range(1, unassigned + 1)]
        slots = _most(slots, tests, lambda test: fits(test, d))
    dense_only = [Slot(n, n) for n in _by_shares(every, gpus)]  # every expert in host memory
    surplus = sum(p.free - p.margin - p.used for p in held(dense_only, sizes, kv_per_layer, gpus))
    if surplus <= 0 or not any(s.n_part for s in slots):
        return slots
    start, d = next(d for d in range(nd) if slots[d].n_part), -1  # the first device with partial layers
    while (d := d + 1) <= start < nd:  # 2. partial layers made whole, front to back
        chain, last = [], (slots, start)
        while (last := _convert(*last, d)) is not None:
            chain.append(last)
        slots, start = _most((slots, start), chain,
                             lambda test: sum(s.n_full for s in test[0]) < every and fits(test[0], d))
        if start >= nd or not slots[start].n_part or slots[start].n_layer <= (0 if d < nd - 1 else 1):
            continue
        test, at = _convert(slots, start, d, partial=True)  # part of one more layer

        def trial(overflow: str) -> list[Slot] | None:
            candidate = _with(test, d, dataclasses.replace(test[d], overflow=overflow, spill=d < nd - 1))
            ok = fits(candidate, d, strict=True) and (d + 1 == nd or fits(candidate, d + 1, strict=True))
            return candidate if ok else None

        if (up := trial("up")) is not None:
            slots, start = trial("gate") or up, at
        elif (attn := trial("attn")) is not None:
            slots, start = attn, at
    return slots


def _with(slots: list[Slot], d: int, slot: Slot) -> list[Slot]:
    return [slot if i == d else s for i, s in enumerate(slots)]


def _most(current, tests: list, fits):
    """The last of ``tests`` (each one step further than the one before) that ``fits``, as
    ``common/fit.cpp`` searches: the furthest first, else step by step while they fit;
    ``current`` where none does."""
    if tests and fits(tests[-1]):
        return tests[-1]
    for test in tests:
        if not fits(test):
            break
        current = test
    return current


def _convert(slots: list[Slot], start: int, d: int, partial: bool = False) -> tuple[list[Slot], int] | None:
    """``slots`` with one partial layer of the first device from ``start`` that has one moved to
    device ``d``, whole (``partial``: partial, the first one there), and the device that is then
    the first with partial layers; None when there is no partial layer."""
    out = list(slots)
    for j in range(start, len(out)):
        if out[j].n_part:
            out[j] = dataclasses.replace(out[j], n_layer=out[j].n_layer - 1, n_part=out[j].n_part - 1)
            out[d] = dataclasses.replace(out[d], n_layer=out[d].n_layer + 1, n_part=out[d].n_part + int(partial))
            return out, j if out[j].n_part else j + 1
    return None


def _by_shares(every: int, gpus: Devices) -> list[int]:
    """Layers per device when all ``every`` are offloaded by free memory (llama.cpp's default
    split, which its measure of the dense-only surplus uses)."""
    return [len(held) for held in assign_layers(every, every - 1, [float(f) for f in gpus.free])]
