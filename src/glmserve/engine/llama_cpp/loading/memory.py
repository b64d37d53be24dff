"""What a GGUF model takes in memory once loaded (``memory_estimate``, for ``--memory-budget``),
and the KV cache it is started with (``plan_kv``: the layout and context that fit this machine,
decided before llama.cpp allocates it)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import llama_cpp
from llama_cpp._internals import LlamaModel
from llama_cpp._utils import suppress_stdout_stderr

from glmserve.engine.base import EngineError
from glmserve.engine.llama_cpp.settings import LlamaCppSettings
from glmserve.engine.llama_cpp.speculative import SpeculativeConfig
from glmserve.engine.llama_cpp.speculative.ngram_pool import POOL_SIZE
from glmserve.models import gguf_bytes


# bytes per block and elements per block of each --cache-type-k/-v (ggml's type traits)
CACHE_TYPE_SIZES = {"f32": (4, 1), "f16": (2, 1), "bf16": (2, 1), "q8_0": (34, 32), "q4_0": (18, 32),
                    "q4_1": (20, 32), "iq4_nl": (18, 32), "q5_0": (22, 32), "q5_1": (24, 32)}
# each one's number in ggml.h's enum ggml_type (llama-cpp-python names no GGML_TYPE_BF16)
CACHE_GGML_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "iq4_nl": 20, "bf16": 30}
_ALIGN = 256  # llama.cpp pads each KV stream to a multiple of 256 cells


@dataclass(frozen=True)
class KVShape:
    """The elements one KV cell holds over all layers: ``k`` of K and ``v`` of V."""

    k: int
    v: int

    def bytes_per_cell(self, cache_type_k: str = "f16", cache_type_v: str = "f16") -> int:
        """Bytes of one cell with K and V of those types (``CACHE_TYPE_SIZES``), rounded up."""
        (kb, kn), (vb, vn) = CACHE_TYPE_SIZES[cache_type_k], CACHE_TYPE_SIZES[cache_type_v]
        return -(-self.k * kb // kn) + -(-self.v * vb // vn)


def kv_shape(metadata: dict[str, str], n_layer: int, n_head: int, n_head_kv: int, n_embd: int) -> KVShape:
    """``KVShape`` of a model: every KV head's K (``key_length`` from the GGUF metadata, which
    defaults to n_embd / n_head) and V (``value_length``, defaulting to K's) in every layer. With
    multi-head latent attention (GLM-4.7-Flash, DeepSeek: ``attention.kv_lora_rank`` set), llama.cpp
    caches the latent and the rope part as K (576 wide) and reads V from it: no V cells (measured:
    4096 cells of a 47-layer GLM-4.7-Flash-shaped GGUF, K 211.5 MiB, V 0)."""
    arch = metadata.get("general.architecture", "")
    head_k = int(metadata.get(f"{arch}.attention.key_length", 0) or n_embd // max(n_head, 1))
    head_v = int(metadata.get(f"{arch}.attention.value_length", 0) or head_k)
    if metadata.get(f"{arch}.attention.kv_lora_rank"):
        head_v = 0
    return KVShape(n_layer * n_head_kv * head_k, n_layer * n_head_kv * head_v)


@dataclass(frozen=True)
class KVPlan:
    """The KV cache a model is started with: ``kv_layout`` (split or unified), ``n_ctx`` (tokens
    one request may hold), ``cells`` in all, ``bytes``, and ``choice``: why it differs from what
    the settings asked (None when it does not)."""

    kv_layout: str
    n_ctx: int
    cells: int
    bytes: int
    choice: str | None = None


def physical_memory() -> int:
    """This machine's memory in bytes."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def plan_kv(settings: LlamaCppSettings, n_ctx_train: int, bytes_per_cell: int, weights: int,
            total: int | None = None, gpu: int = 0) -> KVPlan:
    """The KV cache for ``settings`` (in force: ``max_num_seqs`` set) on a machine of ``total``
    bytes (default: this one's) with ``weights`` bytes of weights loaded, and ``gpu`` bytes free
    on the GPUs layers are offloaded to (0: none). With GPUs the cache lives there (llama.cpp
    keeps each offloaded layer's cells with it): ``auto``'s choice below weighs it against what
    the weights leave of the GPUs' memory, and the memory it may take is the host's share and
    the GPUs' together.

    The cache may take what the weights leave of 3/4 of the memory (llama.cpp writes every cell at
    start, so a larger cache ends in the kernel's OOM killer, not an error). ``--kv-layout auto``
    takes split (``n_ctx`` cells per sequence) while it takes at most a quarter of the memory the
    weights leave, else unified (``n_ctx`` cells shared, llama-server's default): a long context
    costs what llama-server's ``-c`` costs. ``--n-ctx 0`` is the training context, capped (in
    steps of 256) to what fits. Raises ``EngineError`` when a context given by ``--n-ctx`` does
    not fit."""
    total = physical_memory() if total is None else total
    left = gpu - min(weights, gpu) if gpu else total - weights  # what the weights leave where the cache lives
    limit, share = total * 3 // 4 + gpu - weights, left // 4
    n_ctx, seqs = settings.n_ctx or n_ctx_train, settings.max_num_seqs

    def cells(layout: str, n: int) -> int:
        return n * seqs if layout == "split" else n

    layout, choice = settings.kv_layout, None
    if layout == "auto":
        layout = "split" if cells("split", n_ctx) * bytes_per_cell <= share else "unified"
        if layout == "unified":
            choice = (f"split ({cells('split', n_ctx)} cells, {_gib(cells('split', n_ctx) * bytes_per_cell)}) would "
                      f"take more than a quarter of the {_gib(left)} the weights leave{' on the GPUs' if gpu else ''}: "
                      f"unified, {n_ctx} cells shared by the {seqs} sequences")
    if cells(layout, n_ctx) * bytes_per_cell > limit:
        fitting = limit // max(bytes_per_cell, 1) // (seqs if layout == "split" else 1) // _ALIGN * _ALIGN
        if settings.n_ctx or fitting < _ALIGN:
            need = cells(layout, n_ctx) * bytes_per_cell
            raise EngineError(
                f"the KV cache ({layout}: {cells(layout, n_ctx)} cells, {_gib(need)}) would not fit in this "
                f"machine's memory ({_gib(total)}{f', the GPUs {_gib(gpu)} free' if gpu else ''}, {_gib(weights)} of "
                f"weights); lower --n-ctx or --max-num-seqs"
                + (", or use --kv-layout unified (n_ctx cells shared by all sequences)" if layout == "split" else "")
                + ", or a smaller --cache-type-k/-v")
        choice = "; ".join(filter(None, [choice, f"the training context ({n_ctx} tokens) would not fit: n_ctx {fitting}"]))
        n_ctx = fitting
    return KVPlan(layout, n_ctx, cells(layout, n_ctx), cells(layout, n_ctx) * bytes_per_cell, choice)


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


@dataclass(frozen=True)
class Header:
    """What a GGUF's metadata says of its size: ``n_layer``, ``n_ctx_train`` and its ``kv`` shape."""

    n_layer: int
    n_ctx_train: int
    kv: KVShape


def read_header(path: Path) -> Header | None:
    """``Header`` of the GGUF at ``path``, read without its weights (llama.cpp's ``vocab_only``);
    None when the metadata lacks a field (a per-layer ``head_count_kv``, say). Raises
    ``EngineError`` for a file llama.cpp cannot read."""
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    try:
        with suppress_stdout_stderr(disable=False):
            model = LlamaModel(path_model=str(path), params=params, verbose=False)
    except (ValueError, RuntimeError, OSError) as exc:
        raise EngineError(f"cannot load {path}: {exc}") from exc
    try:
        meta = model.metadata()
        arch = meta.get("general.architecture", "")
        n_layer, n_head, n_head_kv, n_embd, n_ctx_train = (
            int(meta[f"{arch}.{key}"]) for key in ("block_count", "attention.head_count",
                                                   "attention.head_count_kv", "embedding_length", "context_length"))
    except (KeyError, ValueError):
        return None
    finally:
        model.close()
    return Header(n_layer, n_ctx_train, kv_shape(meta, n_layer, n_head, n_head_kv, n_embd))


def memory_estimate(path: Path, settings: LlamaCppSettings, speculative: SpeculativeConfig | None = None) -> int:
    """Bytes the model at ``path`` takes once loaded with ``settings`` (in force) and
    ``speculative``: the GGUF file (weights, memory-mapped; every shard), a draft model's or the n-gram pool,
    and the KV cache ``plan_kv`` gives it (``read_header``). The file size alone when the
    metadata lacks a field. Raises ``EngineError`` for a file llama.cpp cannot read, or a KV cache
    that cannot fit (``plan_kv``)."""
    size = weights = gguf_bytes(path)
    header = read_header(path)
    if header is None:
        return size
    if speculative is not None and speculative.draft_model is not None:
        size += memory_estimate(speculative.draft_model, settings)
    elif speculative is not None:
        size += POOL_SIZE * 12  # the NgramPool's table
    per_cell = header.kv.bytes_per_cell(settings.cache_type_k, settings.cache_type_v)
    return size + plan_kv(settings, header.n_ctx_train, per_cell, weights).bytes


def model_kv_shape(model: LlamaModel) -> KVShape:
    """``kv_shape`` of a loaded model."""
    handle = model.model
    return kv_shape(model.metadata(), llama_cpp.llama_model_n_layer(handle), llama_cpp.llama_model_n_head(handle),
                    llama_cpp.llama_model_n_head_kv(handle), llama_cpp.llama_model_n_embd(handle))
