"""Embeddings on the llama_cpp engine: a second llama.cpp context over the same model weights.

The context is made with ``embeddings`` on and llama.cpp's pooling off
(``LLAMA_POOLING_TYPE_NONE``), so each decoded token gives its last hidden state (the output of
the final norm, ``result_norm``); the embedding is their mean, L2-normalised, as llama-server's
``/v1/embeddings`` gives with ``--pooling mean`` (its default ``--embd-normalize 2``). Pooling
here rather than in llama.cpp lets an input span several micro-batches: llama.cpp pools only
the tokens of the last one. No LoRA adapter is applied (adapters are set per context, and this
context has none). Created on first use, so a server that never embeds pays nothing; one
sequence at a time, on the engine's worker thread.
"""

from __future__ import annotations

import ctypes

import llama_cpp
import numpy as np
from llama_cpp._utils import suppress_stdout_stderr

from glmserve.engine.base import EngineError
from glmserve.engine.llama_cpp.handles import free_handles

MICRO_BATCH = 512  # tokens per llama_decode (n_batch = n_ubatch)


class Embedder:
    """Embeds token ids with ``model`` (a ``llama_model`` pointer). ``n_ctx``: the longest input
    in tokens; ``n_threads``: llama.cpp's threads. ``free()`` releases the context."""

    def __init__(self, model, n_ctx: int, n_threads: int) -> None:
        self._model = model
        self._n_ctx = n_ctx
        self._n_threads = n_threads
        self._ctx = None
        self._batch = None
        self.size = llama_cpp.llama_model_n_embd(model)

    def _open(self) -> None:
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = self._n_ctx
        params.n_batch = params.n_ubatch = min(MICRO_BATCH, self._n_ctx)
        params.n_seq_max = 1
        params.n_threads = params.n_threads_batch = self._n_threads
        params.embeddings = True
        params.pooling_type = llama_cpp.LLAMA_POOLING_TYPE_NONE
        params.no_perf = True
        with suppress_stdout_stderr(disable=False):
            ctx = llama_cpp.llama_init_from_model(self._model, params)
        if not ctx:
            raise EngineError(f"cannot create a llama.cpp embedding context (n_ctx={self._n_ctx})")
        self._ctx = ctx
        self._batch = llama_cpp.llama_batch_init(params.n_batch, 0, 1)

    def embed(self, token_ids: list[int]) -> list[float]:
        """See ``Engine.embed``. Raises ``EngineError`` when the input is empty or longer than
        ``n_ctx``, ``RuntimeError`` when llama.cpp fails."""
        if not 0 < len(token_ids) <= self._n_ctx:
            raise EngineError(f"an embedding input takes 1 to {self._n_ctx} tokens, not {len(token_ids)}")
        if self._ctx is None:
            self._open()
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self._ctx), True)
        total = np.zeros(self.size, dtype=np.float64)
        batch, step = self._batch, min(MICRO_BATCH, self._n_ctx)
        for start in range(0, len(token_ids), step):
            chunk = token_ids[start:start + step]
            for i, token in enumerate(chunk):
                batch.token[i] = token
                batch.pos[i] = start + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = 1  # an output row: its hidden state
            batch.n_tokens = len(chunk)
            ret = llama_cpp.llama_decode(self._ctx, batch)
            if ret != 0:
                raise RuntimeError(f"llama_decode failed with status {ret} while embedding")
            rows = ctypes.cast(llama_cpp.llama_get_embeddings(self._ctx), ctypes.POINTER(ctypes.c_float))
            total += np.ctypeslib.as_array(rows, shape=(len(chunk), self.size)).sum(axis=0, dtype=np.float64)
        mean = total / len(token_ids)
        norm = float(np.linalg.norm(mean))
        return (mean / norm if norm > 0 else mean).astype(np.float32).tolist()

    def free(self) -> None:
        free_handles(self._batch, self._ctx)
        self._batch = self._ctx = None
