"""What a GGUF model takes in memory once loaded (``memory_estimate``, for ``--memory-budget``),
and the check that its KV cache fits this machine before llama.cpp allocates it."""

from __future__ import annotations

import os
from pathlib import Path

import llama_cpp
from llama_cpp._internals import LlamaModel
from llama_cpp._utils import suppress_stdout_stderr

from glmserve.engine.base import EngineError
from glmserve.engine.llama_cpp.settings import LlamaCppSettings
from glmserve.engine.llama_cpp.speculative import SpeculativeConfig
from glmserve.engine.llama_cpp.speculative.ngram_pool import POOL_SIZE


def kv_bytes_per_cell(metadata: dict[str, str], n_layer: int, n_head: int, n_head_kv: int, n_embd: int) -> int:
    """Bytes of one KV cell over all layers: K and V (f16, llama.cpp's default type) of every KV
    head (``n_head_kv`` x ``key_length`` from the GGUF metadata, which defaults to n_embd / n_head)."""
    arch = metadata.get("general.architecture", "")
    head_dim = int(metadata.get(f"{arch}.attention.key_length", 0) or n_embd // max(n_head, 1))
    return 2 * 2 * n_layer * n_head_kv * head_dim


def kv_cache_cells(settings: LlamaCppSettings, n_ctx_train: int) -> int:
    """The KV cells ``settings`` (in force: ``max_num_seqs`` set) allocates: ``n_ctx`` (0: the
    training context) per sequence when split, ``n_ctx`` in all when unified."""
    wanted = settings.n_ctx or n_ctx_train
    return wanted * settings.max_num_seqs if settings.kv_layout == "split" else wanted


def memory_estimate(path: Path, settings: LlamaCppSettings, speculative: SpeculativeConfig | None = None) -> int:
    """Bytes the model at ``path`` takes once loaded with ``settings`` (in force) and
    ``speculative``: the GGUF file (weights, memory-mapped), a draft model's or the n-gram pool,
    and the KV cache, read from the GGUF metadata without loading the weights
    (llama.cpp's ``vocab_only``). The file size alone when the metadata lacks a field (a
    per-layer ``head_count_kv``, say). Raises ``EngineError`` for a file llama.cpp cannot read."""
    size = path.stat().st_size
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
        return size
    finally:
        model.close()
    if speculative is not None and speculative.draft_model is not None:
        size += memory_estimate(speculative.draft_model, settings)
    elif speculative is not None:
        size += POOL_SIZE * 12  # the NgramPool's table
    return size + kv_cache_cells(settings, n_ctx_train) * kv_bytes_per_cell(meta, n_layer, n_head, n_head_kv, n_embd)


def model_kv_bytes_per_cell(model: LlamaModel) -> int:
    """``kv_bytes_per_cell`` of a loaded model."""
    handle = model.model
    return kv_bytes_per_cell(model.metadata(), llama_cpp.llama_model_n_layer(handle),
                             llama_cpp.llama_model_n_head(handle), llama_cpp.llama_model_n_head_kv(handle),
                             llama_cpp.llama_model_n_embd(handle))


def check_kv_fits(cells: int, bytes_per_cell: int, kv_layout: str) -> None:
    """Raise ``EngineError`` when a KV cache of ``cells`` would take more than 3/4 of this
    machine's memory: llama.cpp writes every cell at start, so such a cache would end in the
    kernel's OOM killer rather than an error."""
    need = cells * bytes_per_cell
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    if need > total * 3 // 4:
        raise EngineError(
            f"the KV cache ({kv_layout}: {cells} cells, {need / 2**30:.1f} GiB) would not fit in this "
            f"machine's memory ({total / 2**30:.1f} GiB); lower --n-ctx or --max-num-seqs"
            + (", or use --kv-layout unified (n_ctx cells shared by all sequences)" if kv_layout == "split"
               else ""))
