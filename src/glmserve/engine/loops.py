"""A generation caught in a loop: the same span of tokens written again and again ("lock lock
lock", a sentence repeated until ``max_tokens``), as reasoning models sometimes do in long
reasoning. Used by the loop guard (``serving/generation/reasoning_budget.py``, ``--loop-guard``).

The test is on token ids, as the model wrote them: the last ``span`` tokens repeat a period of
``p`` tokens (each equals the token ``p`` before it) with ``1 <= p <= max_period``, ``span >=
min_span`` and ``span >= min_repeats * p``. For each period a count is kept of how many tokens in
a row equalled the one ``p`` before, so each token costs ``max_period`` comparisons whatever the
length. The defaults were chosen by measurement: ``benchmarks/loop_guard_corpus.py`` runs the
test over real code and prose (no file fires at the defaults; shorter spans fire on tables and
rules of ``=`` in real files); its results are in ``benchmarks/results/loop_guard_corpus.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_PERIOD = 64  # tokens: a sentence or two
MIN_SPAN = 256  # tokens in the repeating tail
MIN_REPEATS = 4  # times the period is written, at least


@dataclass(frozen=True, slots=True)
class Loop:
    """A loop found: ``period`` tokens written ``span / period`` times, ending at the last token."""

    period: int
    span: int

    @property
    def repeats(self) -> float:
        return self.span / self.period


class LoopDetector:
    """``feed(token_ids)`` -> the ``Loop`` the tokens fed so far end in, or None (see the module
    docstring); ``find`` stops at the first token that ends one. Keeps the last ``max_period``
    tokens and one count per period."""

    __slots__ = ("max_period", "min_span", "min_repeats", "_last", "_runs")

    def __init__(self, max_period: int = MAX_PERIOD, min_span: int = MIN_SPAN, min_repeats: int = MIN_REPEATS) -> None:
        if max_period < 1 or min_span < 2 or min_repeats < 2:
            raise ValueError("a loop needs a period of at least 1 token written at least twice")
        self.max_period, self.min_span, self.min_repeats = max_period, min_span, min_repeats
        self._last: list[int] = []  # the last max_period tokens, oldest first
        self._runs = [0] * (max_period + 1)  # period -> tokens in a row equal to the one `period` before

    def feed(self, token_ids: list[int]) -> Loop | None:
        found = None
        for token in token_ids:
            found = self._push(token) or found
        return found

    def find(self, token_ids: list[int]) -> tuple[int, Loop] | None:
        """Feeds ``token_ids`` up to the first one that ends a loop: (how many were fed, that
        ``Loop``), the rest not fed; None when none does (all fed). A caller handed several tokens
        at once (a merged or speculative output) cuts them where the loop was found, as it would
        have, one token at a time."""
        for i, token in enumerate(token_ids):
            found = self._push(token)
            if found is not None:
                return i + 1, found
        return None

    def _push(self, token: int) -> Loop | None:
        last, runs, n = self._last, self._runs, len(self._last)
        found = None
        for p in range(1, n + 1):
            if last[n - p] == token:
                runs[p] += 1
                span = runs[p] + p
                if found is None and span >= self.min_span and span >= self.min_repeats * p:
                    found = Loop(p, span)
            else:
                runs[p] = 0
        last.append(token)
        if n + 1 > self.max_period:
            del last[0]
        return found
