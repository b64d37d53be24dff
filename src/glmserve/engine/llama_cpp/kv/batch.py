"""One engine step on a llama.cpp context: apply the scheduler's KV operations (host prompt
cache saves and loads included), fill a
``llama_batch`` with every scheduled chunk (each row tagged with its sequence's slot) and the
draft tokens of speculative decoding after them, decode it once, and report which batch rows
carry logits to sample from; with MTP drafts, the MTP context follows every decode and KV
operation (``speculative/mtp.py``)."""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

import llama_cpp

from glmserve.engine.llama_cpp.kv.prompt_cache import HostPromptCache
from glmserve.engine.llama_cpp.kv.sequence import Chunk, KVOp, Sequence

if TYPE_CHECKING:
    from glmserve.engine.llama_cpp.speculative.mtp import MtpDraft


class BatchDecoder:
    """Owns a ``llama_batch`` of ``capacity`` tokens for context ``ctx``. ``free()`` releases it.

    ``by_slot``: put the chunks in slot order. With a split (non-unified) KV cache llama.cpp
    builds a micro-batch from sequences whose ids follow each other in batch order
    (``split_equal``), so slot order lets one micro-batch hold every running sequence."""

    def __init__(self, ctx, capacity: int, by_slot: bool = False) -> None:
        self._ctx = ctx
        self._by_slot = by_slot
        self._memory = llama_cpp.llama_get_memory(ctx)
        self._batch = llama_cpp.llama_batch_init(capacity, 0, 1)
        self.capacity = capacity
        # a second context that follows this one's KV cells (``mtp.MtpDraft``): told every
        # decode (``mirror``), removal and copy of cells
        self.follower: MtpDraft | None = None

    def apply(self, ops: list[KVOp], host_cache: HostPromptCache | None = None) -> None:
        """Apply the scheduler's KV operations in order; ``save`` and ``load`` go through
        ``host_cache`` (llama.cpp's per-sequence state: ``llama_state_seq_get_data`` /
        ``llama_state_seq_set_data``). Raises ``RuntimeError`` when llama.cpp cannot load a state."""
        follower = self.follower
        for op in ops:
            if op.kind == "rm":
                llama_cpp.llama_memory_seq_rm(self._memory, op.slot, op.p0, -1)
                if follower is not None:
                    follower.truncate(op.slot, op.p0)
            elif op.kind == "cp":
                llama_cpp.llama_memory_seq_cp(self._memory, op.src, op.slot, op.p0, op.p1)
                if follower is not None:
                    follower.copy(op.src, op.slot, op.p0, op.p1)
            elif op.kind == "save":
                host_cache.put(op.tokens, op.group, self._state(op.slot), op.salt,
                               follower.save(op.slot) if follower is not None else None)
            else:
                data = op.entry.data
                buf = (ctypes.c_uint8 * len(data)).from_buffer(data)
                if follower is not None:  # the MTP context's cells and rows saved beside the target's
                    follower.restore(op.slot, op.entry.draft)
                if llama_cpp.llama_state_seq_set_data(self._ctx, buf, len(data), op.slot) != len(data):
                    llama_cpp.llama_memory_seq_rm(self._memory, op.slot, 0, -1)
                    raise RuntimeError(f"llama.cpp could not load a cached prompt state into sequence {op.slot}")

    def _state(self, slot: int) -> bytearray:
        """Sequence ``slot``'s state (its KV cells), as llama.cpp writes it."""
        size = llama_cpp.llama_state_seq_get_size(self._ctx, slot)
        data = bytearray(size)
        written = llama_cpp.llama_state_seq_get_data(self._ctx, (ctypes.c_uint8 * size).from_buffer(data), size, slot)
        return data[:written] if written != size else data

    def clear_slot(self, slot: int) -> None:
        llama_cpp.llama_memory_seq_rm(self._memory, slot, 0, -1)
        if self.follower is not None:
            self.follower.clear_slot(slot)

    def truncate(self, slot: int, p0: int) -> None:
        """Drop ``slot``'s cells at positions >= ``p0`` (rejected draft tokens)."""
        llama_cpp.llama_memory_seq_rm(self._memory, slot, p0, -1)
        if self.follower is not None:
            self.follower.truncate(slot, p0)

    def decode(self, chunks: list[Chunk], drafts: dict[Sequence, list[int]] | None = None,
               ) -> list[tuple[Sequence, int]]:
        """Decode ``chunks`` in one batch; returns ``(sequence, batch_row)`` for each chunk that
        samples. A sampling chunk's sequence with a draft in ``drafts`` has the draft's tokens
        decoded after its chunk, at the next positions, with logits: its rows are ``batch_row``
        (the chunk's last token) to ``batch_row + len(draft)``. Raises ``RuntimeError`` when
        llama.cpp fails."""
        drafts = drafts or {}
        chunks = [self._decode_media(chunk) if chunk.seq.media else chunk for chunk in chunks]
        total = sum(chunk.length for chunk in chunks) + sum(len(d) for d in drafts.values())
        if total > self.capacity:
            raise RuntimeError(f"batch of {total} tokens exceeds capacity {self.capacity}")
        if self._by_slot:
            chunks = sorted(chunks, key=lambda chunk: chunk.seq.slot)
        batch = self._batch
        token, pos, n_seq_id, seq_id, logits = batch.token, batch.pos, batch.n_seq_id, batch.seq_id, batch.logits
        rows: list[tuple[Sequence, int]] = []
        spans: list[tuple[int, int, list[int], int]] = []
        i = 0
        for chunk in chunks:
            seq = chunk.seq
            slot, tokens = seq.slot, seq.tokens
            shift = chunk.start - seq.position(chunk.start) if seq.media else 0  # positions an image saves
            if self.follower is not None:
                spans.append((slot, chunk.start, [*tokens[chunk.start:chunk.start + chunk.length],
                                                  *(drafts.get(seq, ()) if chunk.sample else ())], i))
            for p in range(chunk.start, chunk.start + chunk.length):
                token[i] = tokens[p]
                pos[i] = p - shift
                n_seq_id[i] = 1
                seq_id[i][0] = slot
                logits[i] = 0
                i += 1
            if chunk.sample:
                logits[i - 1] = 1
                rows.append((seq, i - 1))
                p = chunk.start + chunk.length - shift
                for t in drafts.get(seq, ()):
                    token[i] = t
                    pos[i] = p
                    n_seq_id[i] = 1
                    seq_id[i][0] = slot
                    logits[i] = 1
                    i += 1
                    p += 1
        batch.n_tokens = i
        if i == 0:  # every chunk ended with an image
            return rows
        ret = llama_cpp.llama_decode(self._ctx, batch)
        if ret != 0:
            raise RuntimeError(f"llama_decode failed with status {ret}" + (" (KV cache full)" if ret == 1 else ""))
        if self.follower is not None:
            self.follower.mirror(spans, i)
        return rows

    def _decode_media(self, chunk: Chunk) -> Chunk:
        """Decode what of ``chunk`` comes before the end of its last image, in order, apart from
        the batch (text in its own ``llama_decode``, each image through its ``chunk.decode``: the
        projector's embeddings at the image's positions); returns the rest, for the batch. A
        chunk never ends inside an image (``Sequence.whole``)."""
        seq, end = chunk.seq, chunk.start + chunk.length
        at = chunk.start
        for span in seq.media:
            if span.end <= at or span.start >= end:
                continue
            if span.start > at:
                self._decode_text(seq, at, span.start)
            span.chunk.decode(self._ctx, seq.position(span.start), seq.slot, self.capacity)
            at = span.end
        return Chunk(seq, at, end - at, chunk.sample) if at > chunk.start else chunk

    def _decode_text(self, seq: Sequence, start: int, end: int) -> None:
        """Decode ``seq.tokens[start:end]`` (text, no logits) into its slot, in batches."""
        batch, shift = self._batch, start - seq.position(start)
        for first in range(start, end, self.capacity):
            rows = range(first, min(end, first + self.capacity))
            for i, p in enumerate(rows):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = seq.tokens[p], p - shift, 1
                batch.seq_id[i][0], batch.logits[i] = seq.slot, 0
            batch.n_tokens = len(rows)
            if (ret := llama_cpp.llama_decode(self._ctx, batch)) != 0:
                raise RuntimeError(f"llama_decode failed with status {ret} before an image")

    def free(self) -> None:
        if self._batch is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
