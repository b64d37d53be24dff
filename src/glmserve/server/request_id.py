"""``x-request-id`` on every response (ASGI middleware), as OpenAI sends one (the ``openai``
SDK exposes it as ``_request_id``).

The client's own ``X-Request-Id`` is echoed when it is a sane token (1-128 visible ASCII
characters); otherwise the server makes one, ``req_<32 hex digits>``. The id is in
``scope["state"]["request_id"]`` for the app, and in ``REQUEST_ID`` while the request is
handled, for its log lines (``server/logs.py``). A Ray Serve replica also names
itself in ``x-glmserve-replica`` (the header says which replica served the response).
"""

from __future__ import annotations

import re
import uuid
from contextvars import ContextVar

HEADER = b"x-request-id"
REPLICA_HEADER = b"x-glmserve-replica"
_SANE = re.compile(rb"^[\x21-\x7e]{1,128}$")
REQUEST_ID: ContextVar[str | None] = ContextVar("glmserve_request_id", default=None)  # the request handled


def new_request_id() -> str:
    return f"req_{uuid.uuid4().hex}"


class RequestId:
    def __init__(self, app, replica_id: str | None = None) -> None:
        self.app = app
        self.extra = [(REPLICA_HEADER, replica_id.encode())] if replica_id else []

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        given = next((v for k, v in scope.get("headers", []) if k == HEADER), None)
        rid = given if given is not None and _SANE.match(given) else new_request_id().encode()
        scope.setdefault("state", {})["request_id"] = rid.decode()

        async def send_with_id(message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != HEADER]
                message = {**message, "headers": [*headers, (HEADER, rid), *self.extra]}
            await send(message)

        token = REQUEST_ID.set(rid.decode())
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            REQUEST_ID.reset(token)
