"""The offload plan measured as llama-server's ``--fit`` measures it (``common/fit.cpp``).

``offload_model``, called at start, reads the GGUF's tensor table and KV shape and plans
(``offload.plan_offload``); with ``--n-gpu-layers auto`` and ``--fit on`` it then measures, by
llama.cpp's dry run (``dry_run.py``), what each GPU would hold: the model's compute buffers,
and what runs beside the model on the same devices (llama.cpp's ``common_fit_extra_model``):
the MTP context of ``--speculative mtp`` (its KV cells and compute buffer; the weights are the
model's) or the draft model of ``--speculative draft`` (its weights, KV cells and compute
buffer, with ``--n-gpu-layers-draft``), measured as llama.cpp measures it, once per context
with every layer of the model offloaded, and added to every candidate. With ``--n-ctx 0`` (no
context given) the context shrinks before layers leave the GPUs (``_fitted_context``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import llama_cpp

from glmserve.engine.base import EngineError
from glmserve.engine.llama_cpp.loading.devices import Device, add_rpc_servers, devices
from glmserve.engine.llama_cpp.loading.dry_run import dry_run
from glmserve.engine.llama_cpp.loading.fit import Devices, LayerBytes, layer_bytes, place
from glmserve.engine.llama_cpp.loading.memory import KVPlan, plan_kv, read_header
from glmserve.engine.llama_cpp.loading.offload import (Offload, apply, draft_gpu_layers, offload_devices, overrides,
                                                       plan_offload)
from glmserve.engine.llama_cpp.settings import LlamaCppSettings
from glmserve.models import gguf_bytes


@dataclass(frozen=True)
class Companion:
    """What runs beside a model on its devices and is fitted with it: its MTP context (``mtp``,
    ``--speculative mtp``) or the draft model at ``draft`` (``--speculative draft``), and the
    vision projector at ``projector`` where it goes on a GPU."""

    mtp: bool = False
    draft: Path | None = None
    projector: Path | None = None

    @classmethod
    def of(cls, settings: LlamaCppSettings, speculative, path: Path) -> Companion:
        """The companion of the model at ``path`` served with ``settings`` and ``speculative``
        (a ``SpeculativeConfig`` or None); no projector where ``vision.find_mmproj`` finds none or
        refuses (it is said where the engine loads the projector). Raises nothing."""
        from glmserve.engine.llama_cpp.vision import find_mmproj

        projector = None
        if not (settings.no_mmproj_offload or settings.batch_invariant):  # on a GPU, as the engine loads it
            try:
                projector = find_mmproj(settings.mmproj, path)
            except EngineError:
                pass
        mtp = speculative is not None and speculative.method == "mtp"
        return cls(mtp, speculative.draft_model if speculative is not None else None, projector)


def offload_model(params, settings: LlamaCppSettings, path: Path,
                  companion: Companion = Companion()) -> tuple[Offload, KVPlan | None, list]:
    """``plan_offload`` for the GGUF at ``path``, the ``--rpc`` servers' devices added first
    (``devices.add_rpc_servers``; llama.cpp uses them from then on): its layers' tensors
    (``fit.layer_bytes``, every shard) and the KV cache ``memory.plan_kv`` gives it (from
    ``memory.read_header``); with ``auto``, fitted again to the compute buffers llama.cpp's dry
    run measures and to ``companion``'s memory (``_measured``; with ``--n-ctx 0`` the context
    first, ``_fitted_context``). Set on llama.cpp's model ``params`` (``apply``); returns it,
    that KV plan (None when the header is not one ``read_header`` knows) and the arrays to keep
    alive until the model is loaded.
    Raises ``EngineError`` (``add_rpc_servers``, ``plan_offload``, ``plan_kv``, an unknown
    ``--override-tensor`` buffer)."""
    add_rpc_servers(settings.rpc)
    header, weights, found = read_header(path), gguf_bytes(path), devices()
    gpu = sum(d.free for d in offload_devices(settings, found)) if settings.n_gpu_layers != 0 else 0

    def replan(n_ctx: int) -> KVPlan:
        per_cell = header.kv.bytes_per_cell(settings.cache_type_k, settings.cache_type_v)
        return plan_kv(settings.model_copy(update={"n_ctx": n_ctx}), header.n_ctx_train, per_cell, weights, gpu=gpu)

    kv = replan(settings.n_ctx) if header is not None else None
    n_layer = header.n_layer if header else 0
    host = [p for p, buffer in overrides(settings, n_layer) if buffer == "CPU"]
    sizes = (gpu and layer_bytes(path, n_layer, host)) or LayerBytes.even(n_layer, weights)  # read where there is a GPU
    offload = plan_offload(settings, sizes, kv.bytes if kv else 0, found)
    if offload_devices(settings, found) and kv is not None and settings.n_gpu_layers == "auto" and settings.fit == "on":
        if settings.n_ctx == 0:
            kv = _fitted_context(params, settings, path, sizes, kv, found, replan, companion)
        offload = _measured(params, settings, path, sizes, kv, found, companion)
    return offload, kv, apply(params, settings, offload)


def _compute(params, settings: LlamaCppSettings, path: Path, kv: KVPlan, candidate: Offload,
             gpus: list[Device]) -> list[int] | None:
    """Bytes of compute buffer each of ``gpus`` would hold with ``candidate`` and the context of
    ``kv``, by llama.cpp's dry run (``dry_run.dry_run``); None where it fails or the context
    cannot be made."""
    context = _context(settings, kv)
    if context is None:
        return None
    _kept = apply(params, settings, candidate)  # alive through the dry run
    measured = dry_run(path, params, context)
    return None if measured is None else [measured.compute.get(d.buffer, 0) for d in gpus]


def _context(settings: LlamaCppSettings, kv: KVPlan, mtp: bool = False):
    """llama.cpp's context parameters of the model with ``kv`` (``mtp``: of its MTP context);
    None where they cannot be made (raised again, and said, where the engine applies the plan)."""
    from glmserve.engine.llama_cpp.params import context_params, with_kv_plan

    try:
        context = context_params(with_kv_plan(settings, kv), kv.cells)
    except EngineError:
        return None
    if mtp:
        context.ctx_type = llama_cpp.LLAMA_CONTEXT_TYPE_MTP
    return context


def _companion(params, settings: LlamaCppSettings, path: Path, kv: KVPlan, candidate: Offload,
               gpus: list[Device], companion: Companion) -> list[int] | None:
    """Bytes each of ``gpus`` would hold for ``companion`` beside the model with ``candidate`` at
    the context of ``kv``: an MTP context's compute buffer (llama.cpp's dry run) and KV cells
    (with the model's last layer, its NextN layer's), a draft model's compute buffer (dry run) and
    its weights and KV cells for the layers ``--n-gpu-layers-draft`` gives the GPUs with
    ``candidate`` (``fit.place``, shared as llama.cpp shares them by free memory), and a
    projector's weights (its file) on the GPU libmtmd takes (``_projector_device``; its compute
    buffer, sized at the first image, is not measured); zeros without one; None where a dry run
    fails."""
    out = _speculative(params, settings, path, kv, candidate, gpus, companion)
    device = _projector_device(gpus, devices()) if companion.projector is not None else None
    if out is not None and device is not None:
        out[device] += companion.projector.stat().st_size
    return out


def _projector_device(gpus: list[Device], found: list[Device]) -> int | None:
    """The index in ``gpus`` of the device libmtmd puts a projector on (``clip.cpp``: ggml's
    first GPU device, else its first integrated one), None where it is not one of them."""
    first = next((d for kind in ("GPU", "IGPU") for d in found if d.kind == kind), None)
    return next((i for i, d in enumerate(gpus) if first is not None and d.name == first.name), None)


def _speculative(params, settings: LlamaCppSettings, path: Path, kv: KVPlan, candidate: Offload,
                 gpus: list[Device], companion: Companion) -> list[int] | None:
    """``_companion``'s MTP context or draft model."""
    from glmserve.engine.llama_cpp.speculative.draft_model import draft_context_params

    if companion.mtp:  # the NextN layers' own context over the model's weights
        context = _context(settings, kv, mtp=True)
        if context is None:
            return None
        _kept = apply(params, settings, candidate)  # alive through the dry run
        run = dry_run(path, params, context)
        if run is None:
            return None
        out = [run.compute.get(d.buffer, 0) for d in gpus]
        last = max((i for i, plan in enumerate(candidate.placement) if plan.layers), default=None)
        if last is not None:
            out[last] += run.kv
        return out
    if companion.draft is None:
        return [0] * len(gpus)
    load = llama_cpp.llama_model_default_params()
    load.n_gpu_layers = draft_gpu_layers(settings, candidate)
    run = dry_run(companion.draft, load, draft_context_params(kv.cells, settings.max_num_seqs,
                                                              kv.kv_layout != "split", settings.n_threads))
    header = read_header(companion.draft)
    if run is None or header is None:
        return None
    sizes = layer_bytes(companion.draft, header.n_layer, []) or LayerBytes.even(header.n_layer,
                                                                                gguf_bytes(companion.draft))
    spread = Devices([d.name for d in gpus], [d.free for d in gpus], [float(d.free) for d in gpus], [0] * len(gpus), 0)
    held = place(min(load.n_gpu_layers, header.n_layer + 1), sizes, run.kv // max(header.n_layer, 1), spread)
    return [run.compute.get(d.buffer, 0) + plan.weights + plan.kv for d, plan in zip(gpus, held)]


def _whole(params, settings: LlamaCppSettings, path: Path, kv: KVPlan, sizes: LayerBytes, found: list[Device],
           companion: Companion) -> tuple[Offload, list[int] | None, list[int] | None]:
    """Every layer offloaded with the context of ``kv``: that plan, the compute buffers each GPU
    would hold and ``companion``'s bytes there (``_compute``, ``_companion``; None where a dry run
    fails)."""
    gpus = offload_devices(settings, found)
    everything = plan_offload(settings.model_copy(update={"n_gpu_layers": "all"}), sizes, kv.bytes, found)
    main = _compute(params, settings, path, kv, everything, gpus)
    return everything, main, main and _companion(params, settings, path, kv, everything, gpus, companion)


def _fitted_context(params, settings: LlamaCppSettings, path: Path, sizes: LayerBytes, kv: KVPlan,
                    found: list[Device], replan, companion: Companion) -> KVPlan:
    """With ``--n-ctx 0`` (no context given), the context at which every layer stays whole on the
    GPUs, as ``common/fit.cpp``'s step 2 shrinks a context not given before layers leave: what
    each device holds with every layer offloaded (weights and KV cells from the tensors, compute
    buffers by llama.cpp's dry run) is taken at ``kv``'s context and at ``--fit-ctx``, and the
    context is the largest multiple of 256 between them at which the use interpolated between the
    two fits every device beside its margin; ``--fit-ctx`` where none does (the layers are then
    fitted to it). ``companion``'s memory is measured at both too. ``replan(n_ctx)``: the KV plan
    of a context. ``kv`` where every layer fits it, or a dry run fails."""
    every = len(sizes.layers) + 1

    def whole(plan: KVPlan, compute: list[int]) -> bool:
        offload = plan_offload(settings, sizes, plan.bytes, found, compute)
        return offload.n_gpu_layers == every and not offload.moved

    def use(plan: KVPlan) -> list[int] | None:
        _, main, extra = _whole(params, settings, path, plan, sizes, found, companion)
        return None if main is None or extra is None else [a + b for a, b in zip(main, extra)]

    high = use(kv)
    if high is None or whole(kv, high) or kv.n_ctx <= settings.fit_ctx:
        return kv
    least = replan(settings.fit_ctx)
    low = use(least)
    if low is None:
        return kv
    span, best = kv.n_ctx - least.n_ctx, least
    lo, hi = least.n_ctx // 256, kv.n_ctx // 256  # in steps of 256 (llama.cpp rounds so for CUDA)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        plan = replan(mid * 256)
        compute = [a + (b - a) * (plan.n_ctx - least.n_ctx) // span for a, b in zip(low, high)]
        if whole(plan, compute):
            lo, best = mid, plan
        else:
            hi = mid - 1
    note = (f"the training context ({kv.n_ctx} tokens) would not leave every layer on the GPUs: n_ctx {best.n_ctx}, "
            f"as llama-server's --fit shrinks a context not given (give --n-ctx to keep it)")
    return dataclasses.replace(best, choice="; ".join(filter(None, [best.choice, note])))


def _measured(params, settings: LlamaCppSettings, path: Path, sizes: LayerBytes, kv: KVPlan,
              found: list[Device], companion: Companion) -> Offload:
    """``auto``'s fit with the compute buffers llama.cpp's dry run measures
    (``dry_run.dry_run``), as ``common/fit.cpp`` measures each candidate: first with every
    layer offloaded (with several GPUs llama.cpp then runs them as a pipeline, whose compute
    buffers are larger); where that does not fit, the layers are fitted again with the compute
    buffers of a partial offload (fewer layers, or experts in host memory), measured for the fit
    and refitted until the plan holds (at most 3 runs, each device's largest measure kept, never
    every layer whole), ``companion``'s memory added to each (an MTP context's as with every
    layer offloaded, as llama.cpp measures it; a draft model's with fewer layers, where
    ``--n-gpu-layers-draft auto`` keeps it on the host). The fit with ``COMPUTE`` per device
    where a dry run fails."""
    gpus, every = offload_devices(settings, found), len(sizes.layers) + 1

    def measure(candidate: Offload) -> list[int] | None:
        return _compute(params, settings, path, kv, candidate, gpus)

    _, main, extra = _whole(params, settings, path, kv, sizes, found, companion)
    if main is None or extra is None:
        return plan_offload(settings, sizes, kv.bytes, found)
    full = [a + b for a, b in zip(main, extra)]  # the companion's added to every candidate, as llama.cpp adds it
    offload = plan_offload(settings, sizes, kv.bytes, found, full)
    if offload.n_gpu_layers == every and not offload.moved:
        return offload
    if companion.draft is not None:  # with fewer layers, the draft's own on the GPUs (--n-gpu-layers-draft)
        extra = _companion(params, settings, path, kv, offload, gpus, companion)
        if extra is None:
            return plan_offload(settings, sizes, kv.bytes, found)
    compute = [0] * len(gpus)
    for _ in range(3):
        measured = measure(offload) if offload.n_gpu_layers else [0] * len(gpus)
        if measured is None:
            return plan_offload(settings, sizes, kv.bytes, found)
        compute = [max(c, m + e) for c, m, e in zip(compute, measured, extra)]
        again = plan_offload(settings, sizes, kv.bytes, found, compute, limit=every - 1)
        settled = (again.n_gpu_layers, again.moved) == (offload.n_gpu_layers, offload.moved)
        offload = again
        if settled:
            break
    return offload
