"""Hand outputs from an engine's worker thread to the asyncio consumer of ``generate``.

Engine-neutral: an engine's worker thread collects a step's outputs in an ``OutputBatch`` and
flushes it (thread-safe, one event-loop wake-up); the request's ``RequestStream`` is what
``Engine.generate`` returns.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable

from glmserve.engine.types import GenerationOutput


class OutputStream:
    """A one-consumer queue bound to the event loop that created it; engine threads fill it
    through ``OutputBatch``. A deque and one waiting future: ``asyncio.Queue``'s loop checks,
    getter list and wake-up bookkeeping cost more than a single consumer needs, once per token."""

    __slots__ = ("_loop", "_items", "_waiter")

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """``loop``: the consumer's event loop (default: the running one)."""
        self._loop = loop or asyncio.get_running_loop()
        self._items: collections.deque[GenerationOutput] = collections.deque()
        self._waiter: asyncio.Future | None = None

    async def get(self) -> GenerationOutput:
        """The next output, waiting for one (one consumer at a time)."""
        while not self._items:
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._items.popleft()

    def put_nowait(self, output: GenerationOutput) -> None:
        """Hand over ``output`` from the consumer's own event loop (other threads: ``OutputBatch``)."""
        self._items.append(output)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


def _put_all(pairs: list[tuple[OutputStream, GenerationOutput]]) -> None:
    for stream, output in pairs:
        stream.put_nowait(output)


class OutputBatch:
    """Outputs of one engine step, handed to the event loop(s) in one wake-up each, instead of
    one thread-safe call per token per sequence. Used from the engine thread only."""

    __slots__ = ("_items",)

    def __init__(self) -> None:
        self._items: list[tuple[OutputStream, GenerationOutput]] = []

    def add(self, stream: OutputStream, output: GenerationOutput) -> None:
        self._items.append((stream, output))

    def flush(self) -> None:
        if not self._items:
            return
        items, self._items = self._items, []
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[OutputStream, GenerationOutput]]] = {}
        for stream, output in items:
            by_loop.setdefault(stream._loop, []).append((stream, output))
        for loop, pairs in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, pairs)
            except RuntimeError:  # that loop is closed: nobody is listening
                pass


class RequestStream:
    """The async iterator of one request's outputs; the last has ``finish_reason`` set.

    ``aclose()`` (or garbage collection) before the last output aborts the request, also when
    iteration never started, so a request whose client left early never runs on for nobody.
    """

    __slots__ = ("request_id", "_outputs", "_abort", "_done", "__weakref__")

    def __init__(self, request_id: str, outputs: OutputStream, abort: Callable[[str], None]) -> None:
        self.request_id = request_id
        self._outputs = outputs
        self._abort = abort
        self._done = False

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> GenerationOutput:
        if self._done:
            raise StopAsyncIteration
        output = await self._outputs.get()
        self._done = output.finished
        return output

    async def aclose(self) -> None:
        self.close()

    def close(self) -> None:
        if not self._done:
            self._done = True
            self._abort(self.request_id)

    def __del__(self) -> None:
        self.close()
