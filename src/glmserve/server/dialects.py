"""The API dialects: how each API the server speaks writes its streams and whole replies, its
error envelope and status, which header its clients send the key in, and the error schema of its
OpenAPI group. Each row of ``ENDPOINTS`` (``server/endpoints.py``) names its dialect, and
``endpoints.dialect_of(path)`` gives the dialect of any path (a path below a row's is that
row's API: ``/v1/messages/batches`` is Anthropic's); the routes, the error handlers
(``server/errors.py``), the key dependencies and the OpenAPI groups (``server/app.py``), and a
batch line's dispatch read it there, and nothing else decides which API a request speaks.

- ``OPENAI_API``: OpenAI's chat and text completions, embeddings and everything else: SSE ``data:``
  lines and ``[DONE]``, whole replies without their null fields, ``{"error": {...}}`` bodies,
  ``Authorization: Bearer``.
- ``RESPONSES_API``: OpenAI's Responses: as OpenAI's, but replies keep their null fields (Open
  Responses' ``ResponseResource`` requires each one).
- ``ANTHROPIC_API``: Anthropic's Messages: ``event:`` + ``data:`` SSE events, whole replies,
  ``{"type": "error", "error": {...}}`` bodies with 503 as 529, ``x-api-key`` (or a bearer token).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from fastapi import Request
from pydantic import BaseModel

from glmserve.protocol import anthropic
from glmserve.protocol.anthropic import ErrorEnvelope
from glmserve.protocol.errors import APIError, ErrorResponse
from glmserve.server.auth import require_anthropic_key, require_api_key
from glmserve.server.sse import ANTHROPIC, OPENAI, RESPONSES, SSEDialect


@dataclass(frozen=True, slots=True)
class Dialect:
    """``name``; ``stream``: its SSE form and whole-reply dump (``SSEDialect``); ``error``: an
    ``APIError`` as ``(status, body)`` in its envelope; ``key``: the FastAPI dependency that
    checks its clients' key (401 in its envelope); ``error_model``: its error body's schema, for
    its routes' OpenAPI statuses."""

    name: str
    stream: SSEDialect
    error: Callable[[APIError], tuple[int, dict]]
    key: Callable[[Request], Awaitable[None]]
    error_model: type[BaseModel]


def _openai_error(exc: APIError) -> tuple[int, dict]:
    return exc.status_code, exc.body().model_dump()


def _anthropic_error(exc: APIError) -> tuple[int, dict]:
    return anthropic.error_status(exc), anthropic.error_body(exc)


OPENAI_API = Dialect("openai", OPENAI, _openai_error, require_api_key, ErrorResponse)
RESPONSES_API = Dialect("responses", RESPONSES, _openai_error, require_api_key, ErrorResponse)
ANTHROPIC_API = Dialect("anthropic", ANTHROPIC, _anthropic_error, require_anthropic_key, ErrorEnvelope)
