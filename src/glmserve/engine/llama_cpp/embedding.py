"""Embeddings on the llama_cpp engine: a second llama.cpp context over the same model weights.

The context is made with ``embeddings`` on and llama.cpp's pooling off
(``LLAMA_POOLING_TYPE_NONE``), so each decoded token gives its last hidden state (the output of
the final norm, ``result_norm``); they are pooled here as the GGUF's ``{arch}.pooling_type``
says (written by llama.cpp's converter from a sentence-transformers model's pooling config):
``mean`` (also for a model that names none, a chat model, as llama-server's ``--pooling mean``),
``cls`` (the first token's state) or ``last`` (the last token's), then L2-normalised (llama-server's
default ``--embd-normalize 2``). ``rank`` (a reranker) is refused. Pooling here rather than in
llama.cpp lets a causal model's input span several micro-batches (llama.cpp pools only the
tokens of the last one); a non-causal model (``{arch}.attention.causal`` false: BERT-style
encoders) attends over the whole input at once, so its micro-batch is the whole context.
No LoRA adapter is applied (adapters are set per context, and this context has none). Created
on first use, so a server that never embeds pays nothing; one sequence at a time, on the
engine's worker thread.
"""

from __future__ import annotations

import ctypes

import llama_cpp
import numpy as np
from llama_cpp._utils import suppress_stdout_stderr

from glmserve.engine.base import EngineError
from glmserve.engine.llama_cpp.handles import free_handles

MICRO_BATCH = 512  # tokens per llama_decode of a causal model (n_batch = n_ubatch)
# llama.cpp's enum llama_pooling_type, as GGUF files store it
POOLING_TYPES = {0: "mean", 1: "mean", 2: "cls", 3: "last"}  # 0 (none): per-token output, pooled by mean here
RANK_POOLING = 4


def model_pooling(metadata: dict[str, str]) -> tuple[str, bool]:
    """(pooling, causal) of a GGUF model from its metadata: ``mean``, ``cls`` or ``last``, and
    whether its attention is causal. Raises ``EngineError`` for ``rank`` (a reranker) or a
    pooling type llama.cpp does not define."""
    arch = metadata.get("general.architecture", "")
    value = int(metadata.get(f"{arch}.pooling_type", 0))
    if value == RANK_POOLING:
        raise EngineError("this GGUF is a reranker (pooling type rank): it gives scores, not embeddings")
    if value not in POOLING_TYPES:
        raise EngineError(f"unknown pooling type {value} in {arch}.pooling_type")
    return POOLING_TYPES[value], metadata.get(f"{arch}.attention.causal", "true").lower() != "false"


def embeddings_only(metadata: dict[str, str], runner: str, lora: bool, speculative: bool) -> bool:
    """Whether a model is served for embeddings only: ``runner`` (``--runner``) is pooling, or
    auto on a non-causal model. Raises ``EngineError`` for a non-causal model to generate with,
    or ``lora`` / ``speculative`` (flags only generation uses) on one served for embeddings."""
    _, causal = model_pooling(metadata)
    if runner == "generate" or (runner == "auto" and causal):
        if not causal:
            raise EngineError("this is a non-causal model (an embedding encoder): it cannot generate; serve it "
                              "with --runner pooling (or auto)")
        return False
    for flag, given in (("--lora", lora), ("--speculative", speculative)):
        if given:
            raise EngineError(f"{flag} is for generation; this model is served for embeddings only (--runner "
                              "pooling, or a non-causal model with --runner auto)")
    return True


class Embedder:
    """Embeds token ids with ``model`` (a ``llama_model`` pointer, whose GGUF ``metadata`` says
    its pooling). ``n_ctx``: the longest input in tokens; ``n_threads``: llama.cpp's threads.
    ``free()`` releases the context. Raises ``EngineError`` as ``model_pooling``."""

    def __init__(self, model, metadata: dict[str, str], n_ctx: int, n_threads: int) -> None:
        self._model = model
        self._n_ctx = n_ctx
        self._n_threads = n_threads
        self._ctx = None
        self._batch = None
        self.size = llama_cpp.llama_model_n_embd(model)
        self.pooling, self.causal = model_pooling(metadata)
        # a non-causal model's tokens attend to each other in one micro-batch only
        self._micro_batch = min(MICRO_BATCH, n_ctx) if self.causal else n_ctx

    def _open(self) -> None:
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = self._n_ctx
        params.n_batch = params.n_ubatch = self._micro_batch
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
        memory = llama_cpp.llama_get_memory(self._ctx)
        if memory:  # a non-causal model's context has no KV memory
            llama_cpp.llama_memory_clear(memory, True)
        total = np.zeros(self.size, dtype=np.float64)
        first = last = None
        batch, step = self._batch, self._micro_batch
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
            pointer = ctypes.cast(llama_cpp.llama_get_embeddings(self._ctx), ctypes.POINTER(ctypes.c_float))
            rows = np.ctypeslib.as_array(pointer, shape=(len(chunk), self.size)).astype(np.float64)
            total += rows.sum(axis=0)
            first = rows[0].copy() if first is None else first
            last = rows[-1].copy()
        pooled = {"mean": total / len(token_ids), "cls": first, "last": last}[self.pooling]
        norm = float(np.linalg.norm(pooled))
        return (pooled / norm if norm > 0 else pooled).astype(np.float32).tolist()

    def free(self) -> None:
        free_handles(self._batch, self._ctx)
        self._batch = self._ctx = None
