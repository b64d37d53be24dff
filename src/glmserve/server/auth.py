"""API-key checks for ``--api-key``: ``Authorization: Bearer KEY`` (OpenAI's 401 body:
``invalid_api_key``) and, on Anthropic's routes, ``x-api-key: KEY`` as well (Anthropic's
clients send that; the 401 is then Anthropic's ``authentication_error``)."""

from __future__ import annotations

import secrets

from fastapi import Request

from glmserve.protocol.errors import APIError


def _matches(token: str, expected: str) -> bool:
    return secrets.compare_digest(token.strip().encode(), expected.encode())


def _bearer(request: Request) -> str | None:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token if scheme.lower() == "bearer" else None


async def require_api_key(request: Request) -> None:
    """FastAPI dependency: 401 unless ``Authorization: Bearer <key>`` matches the server's key
    (when one is set)."""
    expected: str | None = request.app.state.api_key
    if not expected:
        return
    token = _bearer(request)
    if token is None or not _matches(token, expected):
        raise APIError(
            401,
            "Incorrect API key provided. Send it as 'Authorization: Bearer <key>'.",
            "invalid_request_error",
            None,
            "invalid_api_key",
        )


async def require_anthropic_key(request: Request) -> None:
    """FastAPI dependency for Anthropic's routes: 401 unless ``x-api-key`` or a bearer token
    matches the server's key (when one is set). ``anthropic-version`` and ``anthropic-beta``
    headers are tolerated, whatever they say."""
    expected: str | None = request.app.state.api_key
    if not expected:
        return
    tokens = [t for t in (request.headers.get("x-api-key"), _bearer(request)) if t is not None]
    if not any(_matches(t, expected) for t in tokens):
        raise APIError(401, "invalid x-api-key: send the server's --api-key as 'x-api-key: <key>'",
                       "authentication_error", None, "invalid_api_key")
