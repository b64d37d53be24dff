"""N-gram statistics kept across requests, for ``--speculative ngram`` (llama.cpp's ``ngram-mod``,
ggml-org/llama.cpp PR 19164): a table from the hash of ``n`` consecutive tokens to the token that
followed them, fed with every finished sequence's generated tokens (and the ``n`` tokens before
its first) and shared by all sequences of an engine. A draft is a chain of lookups: the last
``n`` tokens give the next one, which extends the context for the next lookup.

It drafts what no single sequence holds: a retried or repeated generation, an agent writing
again the file it wrote in another conversation, a reply that repeats an earlier reply. The
table has a fixed size (``POOL_SIZE`` slots, 12 bytes each); an n-gram that lands on a taken slot
replaces it, and each slot keeps 32 more bits of the hash, so a lookup rarely takes another
n-gram's token (a wrong draft token is rejected by verification, never emitted).
"""

from __future__ import annotations

from array import array

POOL_NGRAM = 24  # tokens hashed per lookup (llama.cpp's --spec-ngram-mod-n-match default)
POOL_SIZE = 1 << 20  # slots: 12 MiB


class NgramPool:
    """``add(tokens, start, salt)`` records the n-grams of ``tokens`` whose next token is at
    ``start`` or later; ``draft(tokens, limit, salt)`` is the chain of up to ``limit`` tokens the
    table predicts after ``tokens`` (empty: the last n-gram is unknown). ``salt``: the requests'
    ``cache_salt`` (per API key where a server has several) as an int, hashed with each n-gram, so a
    sequence drafts only from generations of its own salt: another key's text never speeds a
    request up (a timing side channel, as a shared prefix cache would be). Worker thread only."""

    __slots__ = ("n", "_size", "_check", "_next")

    def __init__(self, n: int = POOL_NGRAM, size: int = POOL_SIZE) -> None:
        self.n, self._size = n, size
        self._check = array("l", [0]) * size
        self._next = array("i", [-1]) * size

    def _slot(self, key: tuple[int, ...], salt: int | None) -> tuple[int, int]:
        h = hash(key) if salt is None else hash((salt, key))  # ints and their tuples hash the same in every process
        return h % self._size, (h >> 32) & 0x7FFFFFFF

    def add(self, tokens: list[int], start: int, salt: int | None = None) -> None:
        n = self.n
        for i in range(max(start, n), len(tokens)):
            slot, check = self._slot(tuple(tokens[i - n:i]), salt)
            self._check[slot], self._next[slot] = check, tokens[i]

    def draft(self, tokens: list[int], limit: int, salt: int | None = None) -> list[int]:
        n = self.n
        if len(tokens) < n:
            return []
        context, out = tokens[-n:], []
        while len(out) < limit:
            slot, check = self._slot(tuple(context[-n:]), salt)
            token = self._next[slot]
            if token < 0 or self._check[slot] != check:
                break
            out.append(token)
            context.append(token)
        return out
