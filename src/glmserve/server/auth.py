"""Bearer-token check for ``--api-key`` (OpenAI's 401 body: ``invalid_api_key``)."""

from __future__ import annotations

import secrets

from fastapi import Request

from glmserve.protocol.errors import APIError


async def require_api_key(request: Request) -> None:
    """FastAPI dependency: 401 unless ``Authorization: Bearer <key>`` matches the server's key
    (when one is set)."""
    expected: str | None = request.app.state.api_key
    if not expected:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(), expected.encode()):
        raise APIError(
            401,
            "Incorrect API key provided. Send it as 'Authorization: Bearer <key>'.",
            "invalid_request_error",
            None,
            "invalid_api_key",
        )
