"""Stop strings with hold-back, so a stop string split across tokens never reaches the client.

The algorithm is vLLM's (``v1/engine/detokenizer.py``): after each text delta, search the
unsent text for any stop string; if none is found, keep back the longest tail of the text that
is still a prefix of some stop string, and release the rest. The stop string itself is not
returned (OpenAI semantics).

Stop strings match what the model wrote: where the engine escapes tags' look-alikes
(``engine/rules.py`` ``TagEscaper``: ``<`` U+E000 ``/think>`` for a ``</think>`` spelled by
ordinary tokens), the text is searched unescaped, and the escaped text before the match is what
is released, so that ``stop: ["</think>"]`` stops at a spelled tag as at the tag's own token.
"""

from __future__ import annotations

from glmserve.engine.rules import TAG_BREAK


def _unescaped(text: str) -> tuple[str, list[int]]:
    """``text`` (``TagEscaper``'s) as the model wrote it, and where each of its characters
    starts in ``text`` (with ``len(text)`` last)."""
    plain, where, i = [], [], 0
    while i < len(text):
        if text[i] == TAG_BREAK:
            if i + 1 < len(text) and text[i + 1] == TAG_BREAK:  # a doubled one: the model's own
                plain.append(TAG_BREAK)
                where.append(i)
                i += 2
                continue
            i += 1  # an escape: nothing the model wrote
            continue
        plain.append(text[i])
        where.append(i)
        i += 1
    where.append(len(text))
    return "".join(plain), where


class StopStringMatcher:
    """Feed text deltas, get back what may be sent now.

    ``feed(delta) -> (text_to_send, stopped)``; after ``stopped`` is True nothing more is
    accepted, and ``matched`` is the stop string found (the first in the text; of two starting
    at the same place, the one listed first). ``flush()`` returns the held-back tail once
    generation ends for another reason. ``escaped``: the deltas are ``TagEscaper``'s text
    (matched unescaped, released as they came).
    """

    __slots__ = ("_stops", "_held", "_escaped", "stopped", "matched")

    def __init__(self, stops: list[str], escaped: bool = False) -> None:
        self._stops = [s for s in stops if s]
        self._held = ""
        self._escaped = escaped
        self.stopped = False
        self.matched: str | None = None

    def feed(self, delta: str) -> tuple[str, bool]:
        if self.stopped:
            return "", True
        if not self._stops:
            return delta, False
        text = self._held + delta
        plain, where = _unescaped(text) if self._escaped and TAG_BREAK in text else (text, None)
        found = [(i, n, s) for n, s in enumerate(self._stops) if (i := plain.find(s)) >= 0]
        if found:
            cut, _, self.matched = min(found)
            self._held = ""
            self.stopped = True
            return text[:cut if where is None else where[cut]], True
        keep = self._longest_partial_suffix(plain)
        at = len(plain) - keep if where is None else where[len(plain) - keep]
        self._held = text[at:] if keep else ""
        return text[:at] if keep else text, False

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
