"""MTP speculative decoding on the llama_cpp engine (``--speculative mtp``; llama.cpp's
``--spec-type draft-mtp``): drafts from the served GGUF's own NextN layers, the multi-token
prediction heads GLM-4.5 and later are trained with (DeepSeek-V3's MTP, Liu et al. 2024, §2.2).

A NextN layer predicts the token after next: at position ``p`` it takes the embedding of token
``x[p]`` and the target model's last hidden state at ``p - 1`` (``h[p-1]``, before the final
norm: llama.cpp's "nextn embeddings"), joins them (``eh_proj``), runs one decoder layer over
them with its own KV cache, and ends in the shared output head. llama.cpp holds it in a second
context of type ``LLAMA_CONTEXT_TYPE_MTP`` over the same model, fed through an extended batch
whose rows carry both a token and an embedding (``llama_batch_ext_set_embd_token``), as
``common/speculative.cpp`` (``common_speculative_impl_draft_mtp``) does:

- **Mirroring**: after every target decode, each sequence's decoded rows are decoded in the MTP
  context too, each token paired with the target's hidden row of the position before it (the
  first with the last row of the sequence's previous decode), so the NextN layer's KV cache
  holds every position the target's does. The target's last hidden rows of each slot are kept
  in a ring (``keep_rows`` plus ``RESTORE_ROWS``). A prefix the target shares from another slot
  is copied here too; a prompt state the target saves in the host prompt cache (``--cache-ram``)
  carries this context's state and ring (``save``/``restore``), so a restored prefix drafts as
  one computed afresh (where the restore point lies within the ring; else its first mirrored
  token is paired with zeros, and drafts see a little less: they stay drafts, verification
  keeps the output).
- **Drafting**: the sequence's last sampled token, paired with the hidden row of the position
  before it, is decoded at its position; the greedy token of that row is the first draft token,
  and each next one comes from the previous draft token paired with the NextN layer's own
  hidden row, until ``limit`` tokens or a token of probability below 0.75
  (``speculative.P_MIN``). The draft rows are then dropped from the MTP cache: the target's
  decode of those tokens mirrors them anew.
- **Rejected drafts**: when verification keeps ``a`` of a draft's tokens, the mirrored rows past
  them are dropped (``truncate``), and the hidden row of the last kept position becomes the one
  the next decode pairs with.

A greedy draft is a point mass, for which the engine's verification (``speculative.py``) is
exact speculative sampling at any temperature.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import llama_cpp
import numpy as np
from llama_cpp import llama_cpp_ext
from llama_cpp._internals import LlamaModel
from llama_cpp._utils import suppress_stdout_stderr

from glmserve.engine.base import EngineError
from glmserve.engine.llama_cpp.speculative import greedy_draft

_FLOAT_P = ctypes.POINTER(ctypes.c_float)
RESTORE_ROWS = 64  # hidden rows kept before a sequence's end beyond a draft's: a restore point a little back


@dataclass(slots=True, eq=False)
class MtpState:
    """A slot's MTP state as saved with a host prompt cache entry: the MTP context's cells
    (``llama_state_seq_get_data``), the target's hidden rows of positions ``lo..end - 1``."""

    data: bytearray
    rows: np.ndarray
    lo: int
    end: int

    @property
    def nbytes(self) -> int:
        return len(self.data) + self.rows.nbytes


def require_nextn(model: LlamaModel) -> None:
    """Raises ``EngineError`` (one line) when the loaded ``model`` has no NextN (MTP) layers."""
    if llama_cpp.llama_model_n_layer_nextn(model.model) < 1:
        raise EngineError("--speculative mtp needs a GGUF with NextN (MTP) layers (GLM-4.5 and later, converted "
                          "with them); this model has none")


class MtpDraft:
    """The NextN layers of ``model`` (loaded with ``load_mtp``) in an MTP context beside the
    target context ``target`` (whose parameters ``params`` it takes: cells, slots, threads),
    for every slot. ``mirror`` after each target decode, ``truncate`` after a rejected draft,
    ``clear_slot`` when a slot's cells are dropped, ``propose`` to draft; ``free()`` releases
    it; ``save`` and ``restore`` a slot with the host prompt cache. ``keep_rows``: how many of the
    target's last hidden rows drafts read back (a verify step's rows: its draft's length plus one
    is enough); ``RESTORE_ROWS`` more are kept for a restore. Raises ``EngineError`` when the
    model has no NextN layers or llama.cpp cannot create the context."""

    def __init__(self, model: LlamaModel, target, params, keep_rows: int = 257) -> None:
        require_nextn(model)
        self._target = target
        self._keep = keep_rows + RESTORE_ROWS  # the ring's rows per slot
        params.ctx_type = llama_cpp.LLAMA_CONTEXT_TYPE_MTP
        with suppress_stdout_stderr(disable=False):
            self._ctx = llama_cpp.llama_init_from_model(model.model, params)
        if not self._ctx:
            raise EngineError("cannot create llama.cpp's MTP context for the model's NextN layers")
        self._memory = llama_cpp.llama_get_memory(self._ctx)
        self._batch = llama_cpp.llama_batch_ext_init(self._ctx)
        self._n_embd = int(llama_cpp.llama_model_n_embd_out(model.model))
        self._n_vocab = model.n_vocab()
        self._zeros = np.zeros(self._n_embd, np.float32)
        # slot -> the target's hidden rows of its last positions, row p % keep for position p
        self._rows: dict[int, np.ndarray] = {}
        self._lo: dict[int, int] = {}  # slot -> the first position whose row the ring holds
        self._end: dict[int, int] = {}  # slot -> positions mirrored (the last row's position + 1)
        llama_cpp_ext.llama_set_embeddings_nextn(target, True, False)  # every row's, not the sampled ones'
        llama_cpp_ext.llama_set_embeddings_nextn(self._ctx, True, True)

    def mirror(self, spans: list[tuple[int, int, list[int], int]], n_rows: int) -> None:
        """Decode in the MTP context what the target just decoded: ``spans`` of ``(slot, first
        position, tokens, first batch row)`` of its batch of ``n_rows`` rows."""
        if not spans:
            return
        hidden = np.ctypeslib.as_array(llama_cpp_ext.llama_get_embeddings_nextn(self._target),
                                       shape=(n_rows, self._n_embd))
        inputs = []
        for slot, start, tokens, row in spans:
            prev = self._hidden(slot, start - 1).copy()
            llama_cpp.llama_memory_seq_rm(self._memory, slot, start, -1)
            for k, token in enumerate(tokens):
                inputs.append((slot, start + k, token, prev if k == 0 else hidden[row + k - 1], False))
            ring = self._rows.get(slot)
            if ring is None:
                ring = self._rows[slot] = np.zeros((self._keep, self._n_embd), np.float32)
            end = start + len(tokens)
            first = max(start, end - self._keep)
            for p in range(first, end):
                ring[p % self._keep] = hidden[row + p - start]
            contiguous = self._lo.get(slot, start) <= start <= self._end.get(slot, start)
            self._lo[slot] = max(self._lo.get(slot, start) if contiguous else start, end - self._keep)
            self._end[slot] = end
        if not self._decode(inputs):
            self.clear()

    def truncate(self, slot: int, p0: int) -> None:
        """Drop ``slot``'s mirrored rows at positions >= ``p0`` (a verification's rejected
        draft tokens)."""
        llama_cpp.llama_memory_seq_rm(self._memory, slot, p0, -1)
        self._end[slot] = min(self._end.get(slot, 0), p0)
        self._lo[slot] = min(self._lo.get(slot, 0), self._end[slot])

    def copy(self, src: int, dst: int, p0: int, p1: int) -> None:
        """Make ``src``'s cells at positions ``p0...p1 - 1`` (``p1`` -1: all) visible to ``dst``
        too (a prompt prefix the target shares between slots: the NextN layer's cells there are
        the same)."""
        llama_cpp.llama_memory_seq_cp(self._memory, src, dst, p0, p1)
        end = self._end.get(src, 0)
        self._end[dst] = end if p1 < 0 else min(p1, end)
        self._lo[dst] = min(self._lo.get(src, 0), self._end[dst])
        if src in self._rows:
            self._rows[dst] = self._rows[src].copy()

    def clear_slot(self, slot: int) -> None:
        llama_cpp.llama_memory_seq_rm(self._memory, slot, 0, -1)
        self._rows.pop(slot, None)
        self._lo.pop(slot, None)
        self._end.pop(slot, None)

    def clear(self) -> None:
        """Drop every slot's cells (after a failed decode: no free cells)."""
        llama_cpp.llama_memory_clear(self._memory, True)
        self._rows.clear()
        self._lo.clear()
        self._end.clear()

    def save(self, slot: int) -> MtpState | None:
        """``slot``'s state, for a host prompt cache entry of the target's (None: nothing mirrored)."""
        end = self._end.get(slot, 0)
        if not end:
            return None
        size = llama_cpp.llama_state_seq_get_size(self._ctx, slot)
        data = bytearray(size)
        written = llama_cpp.llama_state_seq_get_data(self._ctx, (ctypes.c_uint8 * size).from_buffer(data), size, slot)
        lo = self._lo.get(slot, end)
        rows = np.stack([self._rows[slot][p % self._keep] for p in range(lo, end)]) if lo < end \
            else np.zeros((0, self._n_embd), np.float32)
        return MtpState(data[:written], rows, lo, end)

    def restore(self, slot: int, state: MtpState | None) -> None:
        """``slot`` as ``save`` left it (None: cleared)."""
        self.clear_slot(slot)
        if state is None:
            return
        buf = (ctypes.c_uint8 * len(state.data)).from_buffer(state.data)
        if llama_cpp.llama_state_seq_set_data(self._ctx, buf, len(state.data), slot) != len(state.data):
            self.clear_slot(slot)
            return
        ring = self._rows[slot] = np.zeros((self._keep, self._n_embd), np.float32)
        lo = max(state.lo, state.end - self._keep)
        for p in range(lo, state.end):
            ring[p % self._keep] = state.rows[p - state.lo]
        self._lo[slot], self._end[slot] = lo, state.end

    def propose(self, slot: int, tokens: list[int], limit: int) -> list[int]:
        """Up to ``limit`` tokens the NextN layer expects after ``tokens`` (a sequence in slot
        ``slot`` whose last token the target has not decoded yet), greedily, ending before a
        token of probability below ``speculative.P_MIN``; none when the target's hidden row
        before that token is not at hand."""
        pos = len(tokens) - 1
        if limit < 1 or pos < 1 or self._end.get(slot) != pos:
            return []
        at = [pos, self._hidden(slot, pos - 1)]  # the next row's position and the hidden row it pairs with

        def step(token: int | None) -> np.ndarray | None:
            if token is None:
                token = tokens[-1]
            else:  # a drafted token, paired with the NextN layer's own hidden row of the last one
                at[0] += 1
                at[1] = np.ctypeslib.as_array(llama_cpp_ext.llama_get_embeddings_nextn_ith(self._ctx, 0),
                                              shape=(self._n_embd,)).copy()
            if not self._decode([(slot, at[0], token, at[1], True)]):
                return None
            return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self._ctx, 0), shape=(self._n_vocab,))

        draft = greedy_draft(step, limit)
        if draft is None:
            self.clear()
            return []
        llama_cpp.llama_memory_seq_rm(self._memory, slot, len(tokens) - 1, -1)  # mirrored anew once decoded
        return draft

    def _hidden(self, slot: int, pos: int) -> np.ndarray:
        """The target's hidden row at ``pos`` in ``slot`` from the ring (zeros where there is
        none: position -1, a position the ring no longer holds, a prefix reused from a cache
        without this context's state)."""
        ring = self._rows.get(slot)
        if ring is None or not self._lo.get(slot, 0) <= pos < self._end.get(slot, 0):
            return self._zeros
        return ring[pos % self._keep]

    def _decode(self, inputs: list[tuple[int, int, int, np.ndarray, bool]]) -> bool:
        """Decode rows of ``(slot, position, token, hidden row, logits wanted)``; False when
        llama.cpp fails."""
        batch = self._batch
        llama_cpp.llama_batch_ext_clear(batch)
        keep = []
        for slot, pos, token, hidden, output in inputs:
            idx = llama_cpp.llama_batch_ext_add_token(batch, slot, token)
            at = llama_cpp.llama_pos(pos)
            llama_cpp.llama_batch_ext_set_pos(batch, idx, ctypes.byref(at))
            row = np.ascontiguousarray(hidden, dtype=np.float32)
            keep.append(row)
            llama_cpp.llama_batch_ext_set_embd_token(
                batch, idx, llama_cpp.llama_embd(row.ctypes.data_as(_FLOAT_P), 1, self._n_embd))
            if output:
                llama_cpp.llama_batch_ext_set_output_logits(batch, idx, True)
        return llama_cpp.llama_process(self._ctx, llama_cpp.LLAMA_PROCESS_TYPE_DECODE, batch) == 0

    def free(self) -> None:
        if self._batch is not None:
            llama_cpp.llama_batch_ext_free(self._batch)
            self._batch = None
        if self._ctx:
            with suppress_stdout_stderr(disable=False):
                llama_cpp.llama_free(self._ctx)
            self._ctx = None

