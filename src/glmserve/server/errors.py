"""Map every failure to the OpenAI error shape with the right status (llama-cpp-python's
``server/errors.py`` pattern): ``APIError`` as it says, validation errors (FastAPI's 422) as
400, unknown routes 404, anything unexpected 500 (logged, server unharmed)."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from glmserve.protocol.errors import APIError, invalid_request, server_error

log = logging.getLogger("glmserve")


def error_response(exc: APIError) -> JSONResponse:
    return JSONResponse(exc.body().model_dump(), status_code=exc.status_code, headers=exc.headers)


def _param(loc: tuple) -> str | None:
    parts = [str(p) for p in loc if p != "body"]
    # drop pydantic's union-branch tags ("str", "list[...]", "UserMessage") from the path
    parts = [p for p in parts if not (p[:1].isupper() or "[" in p or p in {"str", "int", "float", "bool"})]
    return ".".join(parts) or None


def validation_error(exc: RequestValidationError) -> APIError:
    """The first validation problem as a 400 with ``param`` set to its field path."""
    errors = exc.errors()
    if not errors:
        return invalid_request("invalid request body")
    first = errors[0]
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
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(validation_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return error_response(APIError(exc.status_code, str(exc.detail), kind))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(server_error(f"internal error: {type(exc).__name__}"))
