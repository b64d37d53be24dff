"""Server-Sent Events for chat streams, with a graceful end on server shutdown, in two
dialects (``SSEDialect``):

- OpenAI's (``OPENAI``): each item is one ``data:`` line (chunks without their null fields,
  error bodies whole), followed by ``data: [DONE]`` unless the stream ended with an error;
  keep-alive pings are SSE comments.
- Anthropic's (``ANTHROPIC``): each event is ``event: <type>`` plus its whole object as
  ``data:``; no ``[DONE]`` (``message_stop`` ends it); keep-alive pings are ``ping`` events.

In both, U+0085, U+2028 and U+2029 inside a JSON payload are sent as ``\\u`` escapes (the same
JSON): SSE ends lines only at CR and LF, but common line readers also split at these (Python's
``str.splitlines``, which httpx's ``iter_lines`` uses), and a token of generated text can be one.

On SIGTERM sse-starlette sets a shutdown event for every open stream. A stream then keeps
going until ``grace_s`` has passed; if it has not finished by then, its source is closed
(aborting the engine request) and it ends with the dialect's error event
(``server_shutting_down``; Anthropic's ``overloaded_error``) instead of a cut connection.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
from fastapi import Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.background import BackgroundTask

from glmserve.protocol import anthropic
from glmserve.protocol.errors import APIError, ErrorResponse
from glmserve.server.cancellation import with_cancellation
from glmserve.serving.generation.chunks import StreamItem

log = logging.getLogger("glmserve.stream")

PING_INTERVAL_S = 15
DONE = "[DONE]"


SHUTTING_DOWN = APIError(503, "the server is shutting down; the request was aborted", "server_error", None,
                         "server_shutting_down")


@dataclass(frozen=True, slots=True)
class SSEDialect:
    """How one API writes its streams and bodies. ``payload``: an item as SSE data (a string)
    or an event (a dict with ``event`` and ``data``); ``ends``: whether an item (an error) ends
    the stream; ``done``: sent after the last item (None: nothing); ``error``: the event for an
    error raised by the server itself (shutdown); ``ping``: the keep-alive event (None: an SSE
    comment); ``dump``: a whole (non-streamed) reply as JSON-ready data."""

    payload: Callable[[Any], str | dict]
    ends: Callable[[Any], bool]
    done: str | None
    error: Callable[[APIError], str | dict]
    ping: Callable[[], ServerSentEvent] | None
    dump: Callable[[BaseModel], Any]


# the line breaks JSON leaves raw (it escapes every other one, as a control character)
_LINE_BREAKS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def one_line(payload: str | dict) -> str | dict:
    """``payload`` (SSE data, or an event dict with ``data``) with its JSON's U+0085, U+2028 and
    U+2029 written as ``\\u`` escapes; see the module docstring."""
    if isinstance(payload, dict):
        return {**payload, "data": one_line(payload["data"])}
    return payload if payload.isascii() else payload.translate(_LINE_BREAKS)


def _openai_payload(item: StreamItem) -> str:
    if isinstance(item, str):  # already JSON (ChatService.create(encoded=True))
        return item
    if isinstance(item, ErrorResponse):
        return item.model_dump_json()
    return item.model_dump_json(exclude_none=True)


def _anthropic_event(kind: str, data: dict) -> dict:
    return {"event": kind, "data": json.dumps(data, ensure_ascii=False, separators=(",", ":"))}


OPENAI = SSEDialect(
    payload=_openai_payload, ends=lambda item: isinstance(item, ErrorResponse), done=DONE,
    error=lambda exc: exc.body().model_dump_json(), ping=None, dump=lambda m: m.model_dump(exclude_none=True))
# /v1/responses: OpenAI's streams, but the response object keeps its null fields (the Open
# Responses ResponseResource requires each one, null or not)
RESPONSES = SSEDialect(  # an event, or one already encoded (ResponsesService.create(encoded=True))
    payload=lambda item: item if type(item) is str else item.model_dump_json(), ends=OPENAI.ends, done=DONE,
    error=OPENAI.error, ping=None, dump=lambda m: m.model_dump())
ANTHROPIC = SSEDialect(  # an event, or one already encoded as {"event", "data"} (MessagesService(encoded=True))
    payload=lambda event: event if type(event) is dict else {"event": event.type, "data": event.model_dump_json()},
    ends=lambda event: type(event) is not dict and event.type == "error",
    done=None, error=lambda exc: _anthropic_event("error", anthropic.error_body(exc)),
    ping=lambda: ServerSentEvent(event="ping", data='{"type":"ping"}'), dump=lambda m: m.model_dump())


async def stream_until_shutdown(source: AsyncIterator[StreamItem], shutdown: anyio.Event, grace_s: float,
                                dialect: SSEDialect = OPENAI,
                                close: Callable[[], Awaitable[None]] | None = None) -> AsyncIterator[bytes]:
    """``source``'s payloads as SSE events (bytes), until it ends (then ``[DONE]``), or until
    ``grace_s`` after ``shutdown`` is set (then an error event).

    Each item is awaited in this task, with no task, ``asyncio.wait`` or timeout context per
    item (``asyncio.timeout_at`` cost ~2 µs per token): until a shutdown nothing guards a step;
    then a timer at the deadline cancels the step pending then (and only a cancellation of its
    own, as ``asyncio.timeout`` tells them apart: ``Task.uncancel``), and a step that begins
    after the deadline is not awaited. However this generator ends (the stream's end, a client
    disconnect cancelling it while a step is pending, a failed write closing it at a
    ``yield``), ``close`` (default: ``source.aclose``) is awaited, which aborts the engine
    request; the clean-up is shielded from anyio's cancellation, which sse-starlette re-delivers
    at every await."""
    loop, task = asyncio.get_running_loop(), asyncio.current_task()
    shutdown_seen = asyncio.ensure_future(shutdown.wait())
    deadline: float | None = None
    pending = expired = False  # a step awaits the source; the deadline cancelled it
    timer: asyncio.TimerHandle | None = None

    def expire() -> None:
        nonlocal expired
        if pending and not expired:
            expired = True
            task.cancel()

    def on_shutdown(_: asyncio.Future) -> None:
        nonlocal deadline, timer
        if not shutdown_seen.cancelled():
            deadline = loop.time() + grace_s
            timer = loop.call_at(deadline, expire)

    shutdown_seen.add_done_callback(on_shutdown)
    try:
        while True:
            if deadline is not None and loop.time() >= deadline:
                yield _shutdown_event(dialect)
                return
            try:
                pending = True
                try:
                    item = await anext(source)
                finally:
                    pending = False
            except StopAsyncIteration:
                if dialect.done is not None:
                    yield _event(dialect.done)
                return
            except asyncio.CancelledError:
                if not expired or task.uncancel() > 0:  # not (only) the deadline's
                    raise
                yield _shutdown_event(dialect)
                return
            payload = one_line(dialect.payload(item))
            yield _event(payload)
            if dialect.ends(item):  # logged with the request's id (server/logs.py)
                log.warning("a stream ended with an error: %s", str(payload)[:500])
                return
    finally:
        with anyio.CancelScope(shield=True):
            shutdown_seen.cancel()
            if timer is not None:
                timer.cancel()
            await (source.aclose() if close is None else close())


def _shutdown_event(dialect: SSEDialect) -> bytes:
    log.warning("a stream was ended by the server's shutdown")
    return _event(one_line(dialect.error(SHUTTING_DOWN)))


def _event(payload: str | dict) -> bytes:
    """One SSE event, as sse-starlette's ``ServerSentEvent`` encodes it (``\\r\\n`` line ends):
    ``payload`` as its ``data`` (one line: JSON, or ``[DONE]``), or a dict's ``event`` and
    ``data``."""
    if isinstance(payload, dict):
        return f"event: {payload['event']}\r\ndata: {payload['data']}\r\n\r\n".encode()
    return f"data: {payload}\r\n\r\n".encode()


class _EventSourceResponse(EventSourceResponse):
    """sse-starlette's response without its per-event cancel scope where no send timeout is set
    (3.x wraps every send in ``anyio.move_on_after(send_timeout)``, ``None`` included: a tenth
    of the API process's CPU time at 32 streams on vLLM, ``benchmarks/serving_overhead.py
    --profile``)."""

    async def _send_with_timeout(self, send, message) -> None:
        if self.send_timeout is None:
            await send(message)
        else:
            await super()._send_with_timeout(send, message)


def event_stream(source: AsyncIterator[StreamItem], shutdown_timeout_s: float,
                 dialect: SSEDialect = OPENAI, release: Callable[[], None] | None = None) -> EventSourceResponse:
    """An SSE response of ``source``'s items. ``source`` is closed when the response ends, also
    when the client left before the stream was first read (``background``); then ``release``
    is called (once)."""
    shutdown = anyio.Event()
    grace = max(0.0, shutdown_timeout_s - 1.0)
    close = _closer(source, release)
    return _EventSourceResponse(
        stream_until_shutdown(source, shutdown, grace, dialect, close),
        ping=PING_INTERVAL_S,
        ping_message_factory=dialect.ping,
        shutdown_event=shutdown,
        shutdown_grace_period=grace + 0.5,
        background=BackgroundTask(close),
    )


def _closer(source: AsyncIterator[StreamItem], release: Callable[[], None] | None) -> Callable[[], Awaitable[None]]:
    """``close()``: closes ``source``, then calls ``release``; once, however often it is called
    (a generator's ``finally`` would not run for a stream never read)."""
    closed = False

    async def close() -> None:
        nonlocal closed
        if closed:
            return
        closed = True
        try:
            await source.aclose()
        finally:
            if release is not None:
                release()

    return close


async def respond(result: Awaitable[BaseModel | AsyncIterator[StreamItem] | None], request: Request,
                  dialect: SSEDialect = OPENAI, release: Callable[[], None] | None = None) -> Response:
    """The HTTP response for a handler's ``result`` (awaited under ``with_cancellation``): a
    whole object as JSON (OpenAI's: without its null fields), a stream as SSE in ``dialect``;
    499 when the client left. ``release``: called once the result no longer needs its model
    (after a whole object; when a stream's source is closed; on an error)."""
    try:
        result = await with_cancellation(result, request)
    except BaseException:
        if release is not None:
            release()
        raise
    if result is None or isinstance(result, BaseModel):
        if release is not None:
            release()
        if result is None:  # the client went away; nobody reads this
            return Response(status_code=499)
        body = dialect.dump(result)
        return JSONResponse(body, headers=prefill_header(body))
    return event_stream(result, request.app.state.shutdown_timeout, dialect, release)


PREFILL_HEADER = "x-glmserve-prefill-start"


def prefill_header(body: Any) -> dict[str, str] | None:
    """The miss report of a whole reply's usage (``protocol/usage.py``'s ``prefill_start``, in
    ``usage`` or one of its details objects) as a response header, its fields as ``key=value``
    pairs (``token=12; message=0; role=system``; ``after=null``: before the first message); None
    when the body has none. A stream's headers are sent before its prompt is read: there the
    report is in the usage event only."""
    usage = body.get("usage") if isinstance(body, dict) else None
    if not isinstance(usage, dict):
        return None
    report = usage.get("prefill_start") or next(
        (v["prefill_start"] for v in usage.values() if isinstance(v, dict) and v.get("prefill_start")), None)
    if not report:
        return None
    return {PREFILL_HEADER: "; ".join(f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in report.items())}
