"""Map every failure to the error shape of the API that was called, with the right status
(llama-cpp-python's ``server/errors.py`` pattern): ``APIError`` as it says, validation errors
(FastAPI's 422) as 400, unknown routes 404, anything unexpected 500 (logged, server unharmed).

The body and status are those of the path's API dialect (``server/endpoints.dialect_of``):
under ``/v1/messages`` Anthropic's envelope (``protocol/anthropic.py``: ``{"type": "error",
"error": {"type", "message"}}``, 503 as 529), everywhere else OpenAI's."""

from __future__ import annotations

import json
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from glmserve.protocol.errors import APIError, invalid_request, server_error
from glmserve.server.endpoints import dialect_of

log = logging.getLogger("glmserve")


class ASCIIJSONResponse(JSONResponse):
    """JSON with non-ASCII characters escaped: an error message that quotes the client's input
    (a model name holding a lone surrogate, say), or a stored object made of it, can always be
    encoded."""

    def render(self, content) -> bytes:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def error_content(exc: APIError, path: str) -> tuple[int, dict]:
    """``(status, body)`` of ``exc`` in the error dialect of the API ``path`` belongs to."""
    return dialect_of(path).error(exc)


def error_response(exc: APIError, path: str = "") -> JSONResponse:
    status, body = error_content(exc, path)
    return ASCIIJSONResponse(body, status_code=status, headers=exc.headers)


async def send_error(send, exc: APIError, path: str) -> None:
    """Answer ``exc`` on a raw ASGI ``send`` (from middleware, before the app), in ``path``'s
    dialect, with ``Connection: close``: the request's body is left unread."""
    status, content = error_content(exc, path)
    body = json.dumps(content, ensure_ascii=True).encode()
    headers = [(k.lower().encode(), v.encode()) for k, v in (exc.headers or {}).items()]
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close"), *headers]})
    await send({"type": "http.response.body", "body": body})


_UNION_TAGS = {"system", "developer", "user", "assistant", "tool", "text", "image_url"}
_TYPE_NAMES = {"str", "int", "float", "bool", "dict", "list"}


def _param(loc: tuple) -> str | None:
    """The field path of a validation error, without pydantic's union-branch labels
    (``messages.0.user.content.str`` -> ``messages.0.content``)."""
    parts: list[str] = []
    items = [p for p in loc if p != "body"]
    for i, item in enumerate(items):
        text = str(item)
        if "[" in text or text in _TYPE_NAMES or text[:1].isupper() or text.startswith("constrained-"):
            continue  # union member labels such as "list[...]", "str", "TextPart"
        after_index = i > 0 and isinstance(items[i - 1], int)
        if after_index and text in _UNION_TAGS and i < len(items) - 1:
            continue  # discriminator tag of a tagged union
        parts.append(text)
    return ".".join(parts) or None


def validation_error(exc: RequestValidationError) -> APIError:
    """The most specific validation problem (deepest field path; for a union, the branch that
    got furthest) as a 400 with ``param`` set to its field path."""
    errors = exc.errors()
    if not errors:
        return invalid_request("invalid request body")
    # a value of the right type but out of bounds says more than "should be a string"
    first = max(errors, key=lambda e: (len(e.get("loc", ())), not e.get("type", "").endswith("_type")))
    kind = first.get("type", "")
    if kind == "json_invalid":
        return invalid_request(f"the request body is not valid JSON: {first.get('ctx', {}).get('error', '')}".rstrip(": "))
    if kind == "model_attributes_type" and _param(first.get("loc", ())) is None:
        return invalid_request("the request body must be a JSON object")
    param = _param(first.get("loc", ()))
    msg = first.get("msg", "invalid value")
    if kind == "missing":
        msg = f"'{param}' is a required property"
    elif kind == "union_tag_invalid":
        tag = first.get("ctx", {}).get("tag")
        expected = first.get("ctx", {}).get("expected_tags")
        msg = f"invalid value {tag!r}: expected one of {expected}"
    elif param:
        msg = f"invalid '{param}': {msg}"
    return invalid_request(msg, param)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        if exc.status_code >= 500:  # the server's failure (or a busy one: a warning), with its request id
            log.log(logging.WARNING if exc.status_code in (503, 529) else logging.ERROR, "%d %s on %s %s: %s",
                    exc.status_code, exc.code or exc.type, request.method, request.url.path, exc.message)
        return error_response(exc, request.url.path)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(validation_error(exc), request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        message = str(exc.detail)
        # no such route: said as OpenAI says it
        if exc.status_code in (404, 405) and message in ("Not Found", "Method Not Allowed"):
            message = f"Invalid URL ({request.method} {request.url.path})"
        return error_response(APIError(exc.status_code, message, kind, headers=exc.headers), request.url.path)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # this handler runs outside the app's middleware, so the request id is added here (and
        # to its log line: server/logs.py)
        request_id = request.scope.get("state", {}).get("request_id")
        log.exception("unhandled error on %s %s", request.method, request.url.path, extra={"request_id": request_id})
        response = error_response(server_error(f"internal error: {type(exc).__name__}"), request.url.path)
        if request_id:
            response.headers["x-request-id"] = request_id
        return response
