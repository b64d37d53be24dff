"""Request body size limit (ASGI middleware): a body over ``max_bytes`` gets a 413 with an
OpenAI error body, whether it declares its length or is sent chunked, before it is buffered."""

from __future__ import annotations

import json

from glmserve.protocol.errors import APIError


class BodySizeLimit:
    def __init__(self, app, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def _reject(self, send) -> None:
        error = APIError(413, f"request body is larger than {self.max_bytes} bytes", "invalid_request_error",
                         None, "request_too_large")
        body = json.dumps(error.body().model_dump()).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self._reject(send)
        seen = 0
        rejected = False

        async def limited_receive():
            nonlocal seen, rejected
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes and not rejected:
                    rejected = True
                    await self._reject(send)
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message) -> None:
            if not rejected:  # the 413 has been sent: the app has nothing more to say
                await send(message)

        await self.app(scope, limited_receive, guarded_send)
