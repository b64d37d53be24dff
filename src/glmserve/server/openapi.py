"""The OpenAPI document: the statuses the server really sends, with OpenAI's error body.

FastAPI declares 422 for every route with parameters, but validation errors are answered 400
(``server/errors.py``), so 422 is dropped and each route declares its error statuses with
``error_responses``.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from glmserve.server.dialects import OPENAI_API, Dialect

ERROR_STATUSES = {
    400: "Invalid request (OpenAI error body; `param` names the field)",
    401: "Missing or wrong API key (`--api-key`)",
    403: "An admin route called with a key that is not an admin key (`--admin-api-key`)",
    404: "Unknown model",
    408: "The request body stopped arriving (`--client-body-timeout`)",
    413: "Request body over `--max-request-bytes`",
    429: "Server at capacity; retry after `Retry-After` seconds",
    500: "The engine failed this request, or the model failed to load (`model_load_failed`)",
    503: "With several models: the model does not fit beside the models in use (`model_busy`); retry after "
         "`Retry-After` seconds",
    529: "The server is shutting down or its engine cannot serve (Anthropic's overloaded_error)",
}


def error_responses(*statuses: int, dialect: Dialect = OPENAI_API,
                    **descriptions: str) -> dict[int | str, dict[str, Any]]:
    """FastAPI ``responses=`` entries for ``statuses``, each with ``dialect``'s error body (the
    route's ``ENDPOINTS`` dialect, ``server/endpoints.dialect_of``) and ``ERROR_STATUSES``'s
    description, or the route's own as ``s503="..."``."""
    return {status: {"model": dialect.error_model,
                     "description": descriptions.get(f"s{status}", ERROR_STATUSES[status])}
            for status in statuses}


def install_openapi(app: FastAPI) -> None:
    """Make ``app.openapi()`` build the document without FastAPI's 422s."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description,
                                 routes=app.routes)
            for operations in schema.get("paths", {}).values():
                for operation in operations.values():
                    operation.get("responses", {}).pop("422", None)
            for unused in ("HTTPValidationError", "ValidationError"):
                schema.get("components", {}).get("schemas", {}).pop(unused, None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
