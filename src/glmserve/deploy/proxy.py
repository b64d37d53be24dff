"""OpenAI-shaped errors from Ray Serve's HTTP proxy, for the failures no replica can answer.

Ray Serve's proxy answers some requests itself: a rejected request when its router queue is
full (``max_queued_requests``, plain text), and nothing usable when the replica serving a
request dies (a bare 500, or a stream cut mid-way). ``OpenAIErrors``, an ASGI middleware
that the proxy loads through Ray Serve's ``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH`` hook
(``middlewares``), turns these into what a glmserve server sends:

- a proxy error response (one without the replica header ``x-glmserve-replica``) gets an
  OpenAI error body with the same status and headers (``Retry-After`` kept);
- a request whose replica ended without answering gets a 502 error body (``replica_failed``);
- an SSE stream whose replica ended before the stream's end gets an OpenAI error event
  (``replica_failed``) and a clean end, as a failing stream on a single server does;
- ``x-request-id``, which both Ray Serve and the app set, is sent once.

The proxy imports this module in its own process: the variable must be set where the proxy
starts (``glmserve serve --replicas`` sets it for the Ray instance it starts; on an existing
cluster, set it in ``ray start``'s environment on the head node)."""

from __future__ import annotations

import json
import logging

from starlette.middleware import Middleware

from glmserve.protocol.errors import APIError
from glmserve.server.request_id import HEADER as REQUEST_ID_HEADER
from glmserve.server.request_id import REPLICA_HEADER

log = logging.getLogger("glmserve.deploy.proxy")

REPLICA_FAILED = ("the replica serving this request stopped before it finished; other requests are not "
                  "affected, and Ray Serve replaces the replica: retry the request")


def _replica_failed() -> APIError:
    return APIError(502, REPLICA_FAILED, "server_error", None, "replica_failed")


def _error_body(status: int, text: str) -> bytes:
    """An OpenAI error body for a proxy response of ``status`` whose body was ``text``."""
    kind = "invalid_request_error" if status < 500 and status != 429 else "server_error"
    message = text.strip() or f"HTTP {status}"
    return APIError(status, message, kind).body().model_dump_json().encode()


def _header(headers, name: bytes) -> bytes | None:
    return next((v for k, v in headers if k.lower() == name), None)


class OpenAIErrors:
    """ASGI middleware around Ray Serve's proxy app; see the module docstring."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = complete = event_stream = False
        held: dict | None = None  # a proxy error response, rewritten once its body is read
        held_body = b""

        async def checked_send(message) -> None:
            nonlocal started, complete, event_stream, held, held_body
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                if _header(headers, REPLICA_HEADER) is None and message["status"] >= 400:
                    held = message
                    return
                seen = False
                kept = []
                for key, value in headers:  # the app's x-request-id, then Ray Serve's copy of it
                    if key.lower() == REQUEST_ID_HEADER:
                        if seen:
                            continue
                        seen = True
                    kept.append((key, value))
                message = {**message, "headers": kept}
                content_type = _header(kept, b"content-type") or b""
                event_stream = content_type.startswith(b"text/event-stream")
                started = True
            elif message["type"] == "http.response.body":
                if held is not None:
                    held_body += message.get("body", b"")
                    if not message.get("more_body", False):
                        await self._send_error(send, held, held_body)
                        held, started, complete = None, True, True
                    return
                if not message.get("more_body", False):
                    complete = True
            await send(message)

        await self.app(scope, receive, checked_send)
        if complete:
            return
        if not started:
            log.warning("%s %s: the replica ended without a response", scope.get("method"), scope.get("path"))
            error = _replica_failed()
            await send({"type": "http.response.start", "status": error.status_code,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": error.body().model_dump_json().encode()})
        elif event_stream:
            log.warning("%s %s: the replica ended during the stream", scope.get("method"), scope.get("path"))
            event = _replica_failed().body().model_dump_json()
            await send({"type": "http.response.body", "body": f"data: {event}\n\n".encode()})

    @staticmethod
    async def _send_error(send, start: dict, body: bytes) -> None:
        try:
            json.loads(body)
            is_json = True
        except ValueError:
            is_json = False
        if not is_json:
            body = _error_body(start["status"], body.decode("utf-8", "replace"))
        headers = [(k, v) for k, v in start.get("headers", [])
                   if k.lower() not in (b"content-type", b"content-length")]
        headers += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({**start, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def middlewares() -> list[Middleware]:
    """Ray Serve's HTTP proxy callback: the middlewares its proxy app runs under (OpenAI error
    bodies, and session affinity: ``deploy.affinity``)."""
    from glmserve.deploy.affinity import SessionAffinity

    return [Middleware(OpenAIErrors), Middleware(SessionAffinity)]
