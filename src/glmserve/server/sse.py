"""Server-Sent Events for chat streams, with a graceful end on server shutdown.

Each item becomes one ``data:`` line (chunks without their null fields, error bodies whole),
followed by OpenAI's ``data: [DONE]`` unless the stream ended with an error.
On SIGTERM sse-starlette sets a shutdown event for every open stream. A stream then keeps
going until ``grace_s`` has passed; if it has not finished by then, its source is closed
(aborting the engine request) and it ends with an OpenAI error event
(``server_shutting_down``) and no ``[DONE]``, instead of a cut connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable

import anyio
from fastapi import Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from sse_starlette import EventSourceResponse
from starlette.background import BackgroundTask

from glmserve.protocol.errors import APIError, ErrorResponse
from glmserve.server.cancellation import with_cancellation
from glmserve.serving.chat import StreamItem

PING_INTERVAL_S = 15
DONE = "[DONE]"


def shutdown_error_event() -> str:
    error = APIError(503, "the server is shutting down; the request was aborted", "server_error", None,
                     "server_shutting_down")
    return error.body().model_dump_json()


def payload(item: StreamItem) -> str:
    if isinstance(item, ErrorResponse):
        return item.model_dump_json()
    return item.model_dump_json(exclude_none=True)


async def stream_until_shutdown(source: AsyncIterator[StreamItem], shutdown: anyio.Event,
                                grace_s: float) -> AsyncIterator[str]:
    """Payloads of ``source`` until it ends (then ``[DONE]``), or until ``grace_s`` after
    ``shutdown`` is set (then an error event).

    However this generator ends (the stream's end, a client disconnect cancelling it while a
    step is pending, a failed write closing it at a ``yield``), ``source`` is closed, which
    aborts the engine request: a pending ``anext(source)`` is cancelled and awaited first,
    since closing a generator that is still running raises instead of closing it. The clean-up
    is shielded from anyio's cancellation, which sse-starlette re-delivers at every await."""
    shutdown_seen = asyncio.ensure_future(shutdown.wait())
    step: asyncio.Future | None = None
    deadline: float | None = None
    loop = asyncio.get_running_loop()
    try:
        while True:
            step = asyncio.ensure_future(anext(source))
            waiting = {step} if deadline is not None else {step, shutdown_seen}
            timeout = None if deadline is None else max(0.0, deadline - loop.time())
            done, _ = await asyncio.wait(waiting, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            if step not in done and deadline is None:  # shutdown began: allow grace_s more
                deadline = loop.time() + grace_s
                done, _ = await asyncio.wait({step}, timeout=grace_s)
            if step not in done:
                yield shutdown_error_event()
                return
            try:
                item = step.result()
            except StopAsyncIteration:
                yield DONE
                return
            yield payload(item)
            if isinstance(item, ErrorResponse):
                return
    finally:
        with anyio.CancelScope(shield=True):
            shutdown_seen.cancel()
            if step is not None and not step.done():
                step.cancel()
                await asyncio.gather(step, return_exceptions=True)
            await source.aclose()


def event_stream(source: AsyncIterator[StreamItem], shutdown_timeout_s: float) -> EventSourceResponse:
    """An SSE response of ``source``'s items. ``source`` is closed when the response ends, also
    when the client left before the stream was first read (``background``)."""
    shutdown = anyio.Event()
    grace = max(0.0, shutdown_timeout_s - 1.0)
    return EventSourceResponse(
        stream_until_shutdown(source, shutdown, grace),
        ping=PING_INTERVAL_S,
        shutdown_event=shutdown,
        shutdown_grace_period=grace + 0.5,
        background=BackgroundTask(source.aclose),
    )


async def respond(result: Awaitable[BaseModel | AsyncIterator[StreamItem] | None], request: Request) -> Response:
    """The HTTP response for a handler's ``result`` (awaited under ``with_cancellation``): a
    whole object as JSON without its null fields, a stream as SSE; 499 when the client left."""
    result = await with_cancellation(result, request)
    if result is None:  # client went away; nobody reads this
        return Response(status_code=499)
    if isinstance(result, BaseModel):
        return JSONResponse(result.model_dump(exclude_none=True))
    return event_stream(result, request.app.state.shutdown_timeout)
