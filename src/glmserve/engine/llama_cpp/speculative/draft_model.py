"""A draft model for speculative decoding on the llama_cpp engine (``--speculative draft
--draft-model PATH``; llama.cpp's ``--model-draft``): a smaller GGUF model with the served
model's vocabulary, in a llama.cpp context of its own on the engine's worker thread.

Its KV cache has the served model's layout (one stream per slot when split), and each slot
remembers which tokens its cells hold. To draft for a sequence, the cells after the longest
prefix those tokens share with the sequence are dropped (the rejected draft tokens of the last
step, or another request's tokens in a reused slot), the rest of the sequence is decoded, and
the draft model then decodes greedily, one token at a time, for up to ``limit`` tokens: it
stops early at a token whose probability is below ``speculative.P_MIN`` (llama.cpp's
``--spec-draft-p-min``: 0.75 by default in earlier llama.cpp releases, 0 in the one
llama-cpp-python 0.3.36 vendors), where a draft is likely to be rejected. A greedy draft is a
point mass, for which the engine's verification (``speculative.py``) is exact speculative
sampling at any temperature.

With a unified KV cache, other slots' stale cells may fill it: a failed decode then clears the
draft model's whole cache, and the sequence drafts nothing that step.
"""

from __future__ import annotations

from pathlib import Path

import llama_cpp
import numpy as np
from llama_cpp._internals import LlamaModel
from llama_cpp._utils import suppress_stdout_stderr

from glmserve.engine.base import EngineError
from glmserve.engine.llama_cpp.handles import free_handles
from glmserve.engine.llama_cpp.speculative import DraftLength, DraftSource, SpeculativeConfig, greedy_draft

PREFILL_BATCH = 512  # tokens per decode when the draft model catches up with a sequence


def vocab_mismatch(model: LlamaModel, draft: LlamaModel) -> str | None:
    """Why ``draft``'s vocabulary is not ``model``'s (its size, its BOS/EOS ids or the text of a
    token), or None when they are the same."""
    n, m = model.n_vocab(), draft.n_vocab()
    if n != m:
        return f"{m} tokens, the model has {n}"
    if (model.token_bos(), model.token_eos()) != (draft.token_bos(), draft.token_eos()):
        return (f"BOS/EOS ids {draft.token_bos()}/{draft.token_eos()}, the model's are "
                f"{model.token_bos()}/{model.token_eos()}")
    get_text, a, b = llama_cpp.llama_vocab_get_text, model.vocab, draft.vocab
    for i in range(n):
        if get_text(a, i) != get_text(b, i):
            theirs, ours = (get_text(v, i).decode(errors="replace") for v in (b, a))
            return f"token {i} is {theirs!r}, the model's is {ours!r}"
    return None


def draft_context_params(cells: int, n_seq_max: int, unified: bool, n_threads: int):
    """llama.cpp's context parameters of a draft model beside a model of ``cells`` KV cells for
    ``n_seq_max`` sequences (``unified``: one stream), decoding ``PREFILL_BATCH`` tokens a step."""
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = cells
    params.n_batch = params.n_ubatch = PREFILL_BATCH
    params.n_seq_max = n_seq_max
    params.n_threads = params.n_threads_batch = n_threads
    params.kv_unified = unified
    params.no_perf = True
    return params


class DraftModel:
    """The draft GGUF at ``path`` loaded beside ``model`` (whose vocabulary it must share), its
    last ``n_gpu_layers`` layers on the GPUs (``offload.draft_gpu_layers``; was every one, as
    llama.cpp's default, whatever the model's), with a KV cache of ``cells`` cells for
    ``n_seq_max`` slots (``unified``: one pool). ``propose``
    drafts; ``free()`` releases everything. Raises ``EngineError`` when the file cannot be
    loaded, its vocabulary differs, or llama.cpp cannot create the context."""

    def __init__(self, path: Path, model: LlamaModel, cells: int, n_seq_max: int, unified: bool,
                 n_threads: int, n_gpu_layers: int = 0) -> None:
        load = llama_cpp.llama_model_default_params()
        load.n_gpu_layers = n_gpu_layers
        try:
            self._model = LlamaModel(path_model=str(path), params=load, verbose=False)
        except (ValueError, RuntimeError, OSError) as exc:
            raise EngineError(f"cannot load the draft model {path}: {exc}") from exc
        self._ctx = None
        self._batch = None
        mismatch = vocab_mismatch(model, self._model)
        if mismatch is not None:
            self.free()
            raise EngineError(f"the draft model {path} has another vocabulary than the model: {mismatch}")
        params = draft_context_params(cells, n_seq_max, unified, n_threads)
        with suppress_stdout_stderr(disable=False):
            self._ctx = llama_cpp.llama_init_from_model(self._model.model, params)
        if not self._ctx:
            self.free()
            raise EngineError(f"cannot create a llama.cpp context for the draft model {path} ({cells} cells)")
        self._memory = llama_cpp.llama_get_memory(self._ctx)
        self._batch = llama_cpp.llama_batch_init(PREFILL_BATCH, 0, 1)
        self._n_vocab = self._model.n_vocab()
        self._cached: dict[int, list[int]] = {}  # slot -> the tokens its KV cells hold, in order

    def propose(self, slot: int, tokens: list[int], limit: int) -> list[int]:
        """Up to ``limit`` tokens the draft model expects after ``tokens`` (a sequence in KV slot
        ``slot``), greedily, ending before a token of probability below ``speculative.P_MIN``."""
        if limit < 1 or not tokens:
            return []
        cached = self._cached.pop(slot, [])
        keep = 0
        for a, b in zip(cached, tokens[:-1]):  # the last token is decoded anew for its logits
            if a != b:
                break
            keep += 1
        llama_cpp.llama_memory_seq_rm(self._memory, slot, keep, -1)
        held = tokens[:keep]

        def step(token: int | None) -> np.ndarray | None:
            pending = tokens[keep:] if token is None else [token]
            if not self._decode(slot, pending, len(held)):
                return None
            held.extend(pending)
            return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self._ctx, -1), shape=(self._n_vocab,))

        draft = greedy_draft(step, limit)
        if draft is None:  # no free cells: start again from an empty cache
            llama_cpp.llama_memory_clear(self._memory, True)
            self._cached.clear()
            return []
        self._cached[slot] = held
        return draft

    def _decode(self, slot: int, tokens: list[int], pos: int) -> bool:
        """Decode ``tokens`` at positions ``pos...`` of ``slot``, logits for the last; False when
        llama.cpp fails (no free KV cells)."""
        batch = self._batch
        for start in range(0, len(tokens), PREFILL_BATCH):
            part = tokens[start:start + PREFILL_BATCH]
            for i, t in enumerate(part):
                batch.token[i] = t
                batch.pos[i] = pos + start + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = slot
                batch.logits[i] = 0
            batch.logits[len(part) - 1] = 1
            batch.n_tokens = len(part)
            if llama_cpp.llama_decode(self._ctx, batch) != 0:
                return False
        return True

    def free(self) -> None:
        free_handles(self._batch, self._ctx, self._model)
        self._batch = self._ctx = self._model = None


class ModelDrafter(DraftLength):
    """One sequence's drafter over a shared ``DraftSource`` (``DraftModel``, ``mtp.MtpDraft``),
    with the adaptive draft length of ``speculative.DraftLength``; the same ``propose(tokens,
    limit, slot)`` and ``record`` as ``NgramDrafter``."""

    __slots__ = ("_draft",)

    def __init__(self, config: SpeculativeConfig, draft: DraftSource) -> None:
        super().__init__(config.draft_max)
        self._draft = draft

    def propose(self, tokens: list[int], limit: int, slot: int = 0) -> list[int]:
        limit = self.budget(limit)
        return self._draft.propose(slot, tokens, limit) if limit > 0 else []
