"""``BlockWriter``: a reply stream (``serving/generation/reply.py``) as a sequence of blocks, one
open at a time: the state machine of the APIs whose streams are blocks (Anthropic's Messages:
content blocks; OpenAI's Responses: output items), each a subclass that writes its own events.

A ``reasoning`` or ``content`` piece goes to the open block of its kind, else it closes the open
block and opens one of its kind; a ``CallStart`` closes the open block and opens the call's
(kind ``arguments``), to which its argument pieces go; an argument piece with no call open, or a
piece of a kind the API leaves out (``hidden``), makes no event. Only the first choice is read
(these APIs have no ``n``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from typing import Any

from glmserve.protocol.errors import APIError
from glmserve.serving.generation.reply import CallStart, Done, Finish, Reply, TextDelta, Tokens


class BlockWriter(ABC):
    """Writes one reply's events (``events()``) through the subclass's hooks: ``start`` (before
    the first block), ``opened``, ``delta``, ``closed``, then ``end`` after the last block, or
    ``error`` where the reply failed (the open block closed first). ``open``: the open block's
    kind (None: none); ``finish`` and ``tokens``: the reply's, once they came."""

    hidden: frozenset[str] = frozenset()

    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self.open: str | None = None
        self.finish = Finish("stop")
        self.tokens = Tokens(0, 0)

    @abstractmethod
    def start(self) -> list[Any]:
        """The events before the first block."""

    @abstractmethod
    def opened(self, kind: str, call: CallStart | None) -> list[Any]:
        """A block of ``kind`` was opened (``call``: the call's start, for ``arguments``)."""

    @abstractmethod
    def delta(self, piece: TextDelta, first: bool) -> Any:
        """The event of ``piece`` in the open block; ``first``: the piece opened it."""

    @abstractmethod
    def closed(self, kind: str, last: bool) -> list[Any]:
        """The open block, of ``kind``, was closed; ``last``: at the reply's end."""

    @abstractmethod
    def end(self) -> list[Any]:
        """The events after the last block (``finish`` and ``tokens`` are the reply's)."""

    @abstractmethod
    def error(self, exc: APIError) -> Any:
        """The event of a failure after the start."""

    def _close(self, last: bool = False) -> list[Any]:
        if self.open is None:
            return []
        kind, self.open = self.open, None
        return self.closed(kind, last)

    def _open(self, kind: str, call: CallStart | None) -> list[Any]:
        out = self._close()
        self.open = kind
        return out + self.opened(kind, call)

    async def events(self) -> AsyncIterator[Any]:
        """The API's events for the reply (see the module docstring)."""
        for e in self.start():
            yield e
        try:
            async for event in self.reply:
                kind = type(event)
                if kind is TextDelta:
                    if event.choice:
                        continue
                    if event.kind == self.open:  # the usual token
                        yield self.delta(event, False)
                    elif event.kind != "arguments" and event.kind not in self.hidden:
                        for e in self._open(event.kind, None):
                            yield e
                        yield self.delta(event, True)
                elif kind is CallStart and not event.choice:
                    for e in self._open("arguments", event):
                        yield e
                elif kind is Finish and not event.choice:
                    self.finish = event
                elif kind is Done:
                    self.tokens = event.tokens
        except APIError as exc:
            for e in self._close():
                yield e
            yield self.error(exc)
            return
        for e in self._close(last=True):
            yield e
        for e in self.end():
            yield e
