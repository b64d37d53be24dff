"""Stop strings with hold-back, so a stop string split across tokens never reaches the client.

The algorithm is vLLM's (``v1/engine/detokenizer.py``): after each text delta, search the
unsent text for any stop string; if none is found, keep back the longest tail of the text that
is still a prefix of some stop string, and release the rest. The stop string itself is not
returned (OpenAI semantics).
"""

from __future__ import annotations


class StopStringMatcher:
    """Feed text deltas, get back what may be sent now.

    ``feed(delta) -> (text_to_send, stopped)``; after ``stopped`` is True nothing more is
    accepted, and ``matched`` is the stop string found (the first in the text; of two starting
    at the same place, the one listed first). ``flush()`` returns the held-back tail once
    generation ends for another reason.
    """

    __slots__ = ("_stops", "_held", "stopped", "matched")

    def __init__(self, stops: list[str]) -> None:
        self._stops = [s for s in stops if s]
        self._held = ""
        self.stopped = False
        self.matched: str | None = None

    def feed(self, delta: str) -> tuple[str, bool]:
        if self.stopped:
            return "", True
        if not self._stops:
            return delta, False
        text = self._held + delta
        found = [(i, n, s) for n, s in enumerate(self._stops) if (i := text.find(s)) >= 0]
        if found:
            cut, _, self.matched = min(found)
            self._held = ""
            self.stopped = True
            return text[:cut], True
        keep = self._longest_partial_suffix(text)
        self._held = text[len(text) - keep:] if keep else ""
        return text[: len(text) - keep], False

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held

    def _longest_partial_suffix(self, text: str) -> int:
        best = 0
        for stop in self._stops:
            for n in range(min(len(stop) - 1, len(text)), best, -1):
                if text.endswith(stop[:n]):
                    best = n
                    break
        return best
