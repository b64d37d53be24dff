"""``server/sse.py``'s ``stream_until_shutdown``: SSE bytes as sse-starlette encodes them, the
end of a stream, a shutdown's grace, and the source closed however the stream ends."""

from __future__ import annotations

import asyncio

import anyio
import pytest
from sse_starlette import ServerSentEvent

from glmserve.protocol.errors import ErrorResponse
from glmserve.server.sse import ANTHROPIC, OPENAI, _event, stream_until_shutdown


class Item:
    """A stream item whose JSON is ``{"n": N}``."""

    def __init__(self, n: int) -> None:
        self.n = n

    def model_dump_json(self, **_) -> str:
        return f'{{"n":{self.n}}}'


class Source:
    """``count`` items, then (``stall``) a step that never ends; records whether it was closed."""

    def __init__(self, count: int, stall: bool = False, error: BaseException | None = None) -> None:
        self.count, self.stall, self.error, self.closed = count, stall, error, False

    async def items(self):
        try:
            for n in range(self.count):
                await asyncio.sleep(0)
                yield Item(n)
            if self.error is not None:
                raise self.error
            if self.stall:
                await asyncio.Event().wait()
        finally:
            self.closed = True


def test_events_are_encoded_as_sse_starlette_encodes_them():
    assert _event('{"a":1}') == ServerSentEvent('{"a":1}').encode()
    assert _event("[DONE]") == ServerSentEvent("[DONE]").encode()
    assert _event({"event": "ping", "data": "{}"}) == ServerSentEvent(event="ping", data="{}").encode()


def test_a_stream_ends_with_done_and_closes_its_source():
    source = Source(3)

    async def run():
        return [e async for e in stream_until_shutdown(source.items(), anyio.Event(), 1.0)]

    assert asyncio.run(run()) == [b'data: {"n":0}\r\n\r\n', b'data: {"n":1}\r\n\r\n', b'data: {"n":2}\r\n\r\n',
                                  b"data: [DONE]\r\n\r\n"]
    assert source.closed


def test_anthropic_events_have_their_type_and_no_done():
    class Event(Item):
        type = "content_block_delta"

    async def items():
        yield Event(1)

    async def run():
        return [e async for e in stream_until_shutdown(items(), anyio.Event(), 1.0, ANTHROPIC)]

    assert asyncio.run(run()) == [b'event: content_block_delta\r\ndata: {"n":1}\r\n\r\n']


def test_shutdown_ends_a_stalled_stream_after_its_grace_with_an_error_event():
    source = Source(2, stall=True)

    async def run():
        shutdown, out = anyio.Event(), []
        async for event in stream_until_shutdown(source.items(), shutdown, 0.05):
            out.append(event)
            if len(out) == 2:
                shutdown.set()  # the next step never ends: the grace runs out
        return out

    out = asyncio.run(run())
    assert len(out) == 3 and b'"code":"server_shutting_down"' in out[2] and out[2].startswith(b"data: {")
    assert source.closed


def test_a_step_that_would_begin_after_the_grace_is_not_awaited():
    source = Source(10)

    async def run():
        shutdown, out = anyio.Event(), []
        async for event in stream_until_shutdown(source.items(), shutdown, 0.05):
            out.append(event)
            shutdown.set()
            await asyncio.sleep(0.2)  # the consumer is slow: the grace runs out between steps
        return out

    out = asyncio.run(run())
    assert len(out) == 2 and b'"code":"server_shutting_down"' in out[1]
    assert source.closed


def test_a_cancellation_during_the_grace_is_not_taken_for_its_end():
    source = Source(1, stall=True)
    events = []

    async def consume(shutdown):
        async for event in stream_until_shutdown(source.items(), shutdown, 5.0):
            events.append(event)

    async def run():
        shutdown = anyio.Event()
        task = asyncio.create_task(consume(shutdown))
        await asyncio.sleep(0.05)  # the stalled step is pending
        shutdown.set()
        await asyncio.sleep(0.05)  # the grace (5 s) timer is armed
        task.cancel()  # the client left
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())
    assert len(events) == 1 and source.closed


def test_a_stream_that_keeps_going_finishes_within_the_grace():
    source = Source(50)

    async def run():
        shutdown, out = anyio.Event(), []
        async for event in stream_until_shutdown(source.items(), shutdown, 30.0):
            shutdown.set()
            out.append(event)
        return out

    out = asyncio.run(run())
    assert len(out) == 51 and out[-1] == b"data: [DONE]\r\n\r\n"


def test_a_cancelled_consumer_closes_the_source_and_stays_cancelled():
    source = Source(1, stall=True)

    async def consume():
        async for _ in stream_until_shutdown(source.items(), anyio.Event(), 1.0):
            pass

    async def run():
        task = asyncio.create_task(consume())
        await asyncio.sleep(0.05)  # the stalled step is pending
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())
    assert source.closed


def test_a_consumer_that_stops_reading_closes_the_source():
    source = Source(10)

    async def run():
        stream = stream_until_shutdown(source.items(), anyio.Event(), 1.0)
        await anext(stream)
        await stream.aclose()  # a failed write closes it at its yield

    asyncio.run(run())
    assert source.closed


def test_a_sources_own_timeout_is_raised_not_taken_for_a_shutdown():
    source = Source(1, error=TimeoutError("the engine's"))

    async def run():
        return [e async for e in stream_until_shutdown(source.items(), anyio.Event(), 1.0)]

    with pytest.raises(TimeoutError, match="the engine's"):
        asyncio.run(run())
    assert source.closed


def test_an_error_item_ends_the_stream_without_done():
    async def items():
        yield ErrorResponse.model_validate({"error": {"message": "boom", "type": "server_error"}})
        yield Item(1)

    async def run():
        return [e async for e in stream_until_shutdown(items(), anyio.Event(), 1.0, OPENAI)]

    out = asyncio.run(run())
    assert len(out) == 1 and b'"message":"boom"' in out[0]


def test_event_stream_sends_each_event_and_keeps_a_send_timeout():
    """``event_stream``'s response (sse-starlette's without the per-event cancel scope when no
    send timeout is set): every event reaches ``send`` after the response start, ``[DONE]`` last;
    with a send timeout, a send that stalls still ends the stream with sse-starlette's error."""
    from sse_starlette.sse import SendTimeoutError

    from glmserve.server.sse import event_stream

    async def run(send_timeout: float | None, stall: bool) -> list[dict]:
        sent: list[dict] = []

        async def send(message: dict) -> None:
            sent.append(message)
            if stall and message.get("body"):
                await asyncio.Event().wait()

        response = event_stream(Source(3).items(), 10.0)
        response.send_timeout = send_timeout
        await response._stream_response(send)
        return sent

    sent = asyncio.run(run(None, stall=False))
    assert sent[0]["type"] == "http.response.start"
    assert [m["body"] for m in sent[1:] if m.get("body")] == [b'data: {"n":0}\r\n\r\n', b'data: {"n":1}\r\n\r\n',
                                                              b'data: {"n":2}\r\n\r\n', b"data: [DONE]\r\n\r\n"]
    with pytest.raises(SendTimeoutError):
        asyncio.run(run(0.05, stall=True))
