"""Host-memory prompt cache: sequence states kept in RAM after their KV cells are reclaimed, as
llama-server's ``--cache-ram`` (``tools/server``: a slot's prompt state is saved before the slot
is reused, and a later prompt sharing a longer prefix with a saved one loads it instead of
recomputing it).

Engine-neutral: an entry holds the tokens whose KV it stores, the group (LoRA adapter) they were
computed under, the cache salt of the request that computed them (an entry serves only prompts
of the same group and salt) and an opaque ``data`` blob the engine wrote (llama.cpp: its per-sequence state,
``llama_state_seq_get_data``). The scheduler asks ``best`` when it admits a request and ``covers``
before it asks the engine to save a sequence; the engine fills entries with ``put``. Bounded in
bytes, least recently used first out. Not thread-safe: the engine thread owns it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


def media_token(pixels: bytes) -> int:
    """The token id each token of an image stands as in a prompt (``sequence.MediaSpan``): a
    negative number (no vocabulary's) from a hash of the image's ``pixels`` (its width, height and
    RGB bytes), so that one image gives one id, as llama-server keys its image chunks by a hash
    of their pixels; a prefix reaches across an image only where both prompts hold that image."""
    return -2 - int.from_bytes(hashlib.blake2b(pixels, digest_size=8).digest(), "little") % (1 << 62)


def common_prefix(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    """Length of the longest common prefix of ``a`` and ``b``, at most ``limit``, never ending
    inside an image (a run of one ``media_token``: when it would, it ends before the image)."""
    n = 0
    for x, y in zip(a, b):
        if n >= limit or x != y:
            break
        n += 1
    if n and a[n - 1] < 0 and not (n < len(a) and a[n] != a[n - 1] and n < len(b) and b[n] != b[n - 1]):
        image = a[n - 1]
        while n and a[n - 1] == image:
            n -= 1
    return n


@dataclass(slots=True, eq=False)
class CachedPrompt:
    """The state of a sequence holding ``tokens`` (positions 0..len-1), computed under
    ``group`` (None: the base model) for a request of cache salt ``salt``; ``draft``: its
    drafter's state beside it (opaque, with an ``nbytes``; the MTP context's), or None."""

    tokens: tuple[int, ...]
    group: str | None
    data: bytes | bytearray
    last_used: int = 0
    salt: str | None = None
    draft: Any = None

    @property
    def nbytes(self) -> int:
        return len(self.data) + (self.draft.nbytes if self.draft is not None else 0)


class HostPromptCache:
    """LRU of ``CachedPrompt``s taking at most ``capacity`` bytes of ``data`` together."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("a host prompt cache needs a capacity of at least 1 byte")
        self.capacity = capacity
        self.entries: list[CachedPrompt] = []
        self.nbytes = 0  # of every entry's data (read by other threads: /metrics)
        self.restores = 0  # entries the scheduler loaded (``touch``)
        self._clock = 0

    def stats(self) -> tuple[int, int, int]:
        """(bytes held, entries, restores since start); safe to call from any thread."""
        return self.nbytes, len(self.entries), self.restores

    def best(self, tokens: Sequence[int], group: str | None, limit: int,
             salt: str | None = None) -> tuple[CachedPrompt | None, int]:
        """The entry of ``group`` and ``salt`` sharing the longest prefix with ``tokens`` (at
        most ``limit`` tokens), and that length; ``(None, 0)`` when none shares any."""
        found, longest = None, 0
        for entry in self.entries:
            if entry.group == group and entry.salt == salt:
                n = common_prefix(entry.tokens, tokens, limit)
                if n > longest:
                    found, longest = entry, n
        return found, longest

    def covers(self, tokens: Sequence[int], group: str | None, salt: str | None = None) -> bool:
        """Some entry of ``group`` and ``salt`` starts with all of ``tokens``: saving them adds
        nothing."""
        n = len(tokens)
        return any(entry.group == group and entry.salt == salt and len(entry.tokens) >= n
                   and common_prefix(entry.tokens, tokens, n) == n for entry in self.entries)

    def touch(self, entry: CachedPrompt) -> None:
        """Mark ``entry`` used (a restore): it is evicted last."""
        self._clock += 1
        entry.last_used = self._clock
        self.restores += 1

    def put(self, tokens: Sequence[int], group: str | None, data: bytes | bytearray,
            salt: str | None = None, draft: Any = None) -> bool:
        """Keep ``data`` (and the drafter's ``draft``) as the state of ``tokens``; entries of
        ``group`` and ``salt`` whose tokens are a prefix of ``tokens`` are dropped (the new one
        serves every prompt they served), then the least recently used go until everything fits.
        False (nothing kept) when the new entry alone is larger than the capacity."""
        tokens = tuple(tokens)
        entry = CachedPrompt(tokens, group, data, 0, salt, draft)
        if entry.nbytes > self.capacity:
            return False
        n = len(tokens)
        kept = [e for e in self.entries
                if not (e.group == group and e.salt == salt and len(e.tokens) <= n
                        and tokens[:len(e.tokens)] == e.tokens)]
        kept.sort(key=lambda e: e.last_used)
        nbytes = sum(e.nbytes for e in kept)
        while kept and nbytes + entry.nbytes > self.capacity:
            nbytes -= kept.pop(0).nbytes
        self._clock += 1
        entry.last_used = self._clock
        kept.append(entry)
        self.entries, self.nbytes = kept, nbytes + entry.nbytes
        return True

    def drop_group(self, group: str) -> None:
        """Forget the entries of ``group`` (its LoRA adapter is unloaded)."""
        self.entries = [e for e in self.entries if e.group != group]
        self.nbytes = sum(e.nbytes for e in self.entries)
