"""Request body limits (ASGI middleware): size and time.

A body over ``max_bytes`` gets a 413, whether it declares its length or is sent chunked, before
it is buffered. A body that stops arriving (a ``Content-Length`` that promises more than is
sent, a client that trickles) gets a 408 once no part of it came for ``timeout_s`` seconds
(nginx's ``client_body_timeout``: the time between two reads, not for the whole body). Both
answer with the called API's error body (OpenAI's, or Anthropic's under ``/v1/messages``) and
close the request.
"""

from __future__ import annotations

import asyncio

from glmserve.protocol.errors import APIError
from glmserve.server.errors import send_error


class BodyLimits:
    def __init__(self, app, max_bytes: int, timeout_s: float = 30.0) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    def _too_large(self) -> APIError:
        return APIError(413, f"request body is larger than {self.max_bytes} bytes", "invalid_request_error", None,
                        "request_too_large")

    def _too_slow(self) -> APIError:
        return APIError(408, f"no part of the request body arrived for {self.timeout_s:g} s", "invalid_request_error",
                        None, "request_timeout")

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await send_error(send, self._too_large(), scope.get("path", ""))
        seen = 0
        body_done = False
        rejected = False

        async def limited_receive():
            nonlocal seen, body_done, rejected
            if rejected:
                return {"type": "http.disconnect"}
            if body_done:  # what follows is the disconnect, whenever it comes
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), self.timeout_s)
            except TimeoutError:
                rejected = True
                await send_error(send, self._too_slow(), scope.get("path", ""))
                return {"type": "http.disconnect"}
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                body_done = not message.get("more_body", False)
                if seen > self.max_bytes:
                    rejected = True
                    await send_error(send, self._too_large(), scope.get("path", ""))
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message) -> None:
            if not rejected:  # the 413/408 has been sent: the app has nothing more to say
                await send(message)

        await self.app(scope, limited_receive, guarded_send)
