"""Hand outputs from an engine's worker thread to the asyncio consumer of ``generate``.

Engine-neutral: an engine's worker thread collects a step's outputs in an ``OutputBatch`` and
flushes it (thread-safe, one event-loop wake-up); the request's ``RequestStream`` is what
``Engine.generate`` returns.

Stream interval (``--stream-interval-ms``, the time counterpart of vLLM's and SGLang's
``--stream-interval`` in tokens): a request's outputs between two flushes are merged into one
(its tokens, text and logprobs joined), and a step's outputs may be held for the next step's,
so that the event loop wakes, and the serving layer renders and writes an SSE event, once for
several tokens. A request's first output and its last are never held, nor is any output past
the interval, nor a ``token_by_token`` request's (``GenerationRequest``).
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable

from glmserve.engine.types import GenerationOutput


class OutputStream:
    """A one-consumer queue bound to the event loop that created it; engine threads fill it
    through ``OutputBatch``. A deque and one waiting future: ``asyncio.Queue``'s loop checks,
    getter list and wake-up bookkeeping cost more than a single consumer needs, once per token."""

    __slots__ = ("_loop", "_items", "_waiter", "merge", "started")

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None, merge: bool = True) -> None:
        """``loop``: the consumer's event loop (default: the running one). ``merge``: False hands
        each output over as the engine gave it, at the end of its step
        (``GenerationRequest.token_by_token``)."""
        self._loop = loop or asyncio.get_running_loop()
        self._items: collections.deque[GenerationOutput] = collections.deque()
        self._waiter: asyncio.Future | None = None
        self.merge = merge
        self.started = False  # an output was handed to ``OutputBatch`` (engine thread)

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


def _merge(into: GenerationOutput, output: GenerationOutput) -> None:
    """``output`` appended to ``into``, an earlier output of the same request not yet handed over."""
    into.token_ids = into.token_ids + output.token_ids
    into.text += output.text
    if into.logprobs is not None or output.logprobs is not None:
        into.logprobs = (into.logprobs or []) + (output.logprobs or [])
    into.finish_reason, into.error, into.invalid = output.finish_reason, output.error, output.invalid
    into.num_prompt_tokens, into.num_cached_tokens = output.num_prompt_tokens, output.num_cached_tokens


class OutputBatch:
    """Outputs of engine steps, handed to the event loop(s) in one wake-up each, instead of one
    thread-safe call per token per sequence, and one output per request (``_merge``). Used from
    the engine thread only.

    ``interval_s``: how long an output may be held for later steps' (0: never held; see the
    module docstring). ``step_done`` decides after each step whether to hand them over now."""

    __slots__ = ("_items", "_open", "_interval_s", "_since", "_urgent")

    def __init__(self, interval_s: float = 0.0) -> None:
        self._items: list[tuple[OutputStream, GenerationOutput]] = []
        self._open: dict[OutputStream, GenerationOutput] = {}  # each merging stream's output in ``_items``
        self._interval_s = interval_s
        self._since = 0.0  # perf_counter() when the oldest output held was added
        self._urgent = False  # a first or last output is held: hand over at the step's end

    def add(self, stream: OutputStream, output: GenerationOutput) -> None:
        held = self._open.get(stream)
        if held is not None:
            if held.finish_reason is None:
                _merge(held, output)
                self._urgent = self._urgent or output.finish_reason is not None
            return  # else: the request has ended, its consumer reads no further
        if not self._items and self._interval_s:  # at 0 nothing is held: no clock to read
            self._since = time.perf_counter()
        self._items.append((stream, output))
        if stream.merge:
            self._open[stream] = output
        self._urgent = self._urgent or not (stream.merge and stream.started) or output.finish_reason is not None
        stream.started = True

    def step_done(self, step_s: float) -> None:
        """After a step of ``step_s`` seconds: hand the outputs over, unless none is a first or
        last one and the next step (taken to last as long) ends within the interval."""
        if self._items and (self._urgent or not self._interval_s
                            or time.perf_counter() - self._since + step_s >= self._interval_s):
            self.flush()

    def flush(self) -> None:
        """Hand every output held to its event loop now."""
        if not self._items:
            return
        items, self._items, self._urgent = self._items, [], False
        self._open.clear()
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
