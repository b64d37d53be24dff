"""The endpoints that run a model, in one table (``ENDPOINTS``): each path's request model, how
its request runs on the model's services, and the API dialect it speaks (``server/dialects.py``:
streams, whole replies, error envelope, key header, OpenAPI error schema). The HTTP routes
(``server/routes/``), a batch line's dispatch (``server/batch_dispatch.py``), the batch route
(which endpoints a batch may name), the error handlers and the key dependencies all read it
(``dialect_of``), so an endpoint is added here once (``docs/design.md``, "Where new things go").

A run differs only by ``Call``: over HTTP, at interactive priority, a stream encoded for the
wire; as a batch line, at ``BATCH_PRIORITY``, whole."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from glmserve.engine.types import BATCH_PRIORITY, INTERACTIVE_PRIORITY
from glmserve.protocol.anthropic import MessagesRequest
from glmserve.protocol.chat import ChatCompletionRequest
from glmserve.protocol.completions import CompletionRequest
from glmserve.protocol.embeddings import EmbeddingRequest
from glmserve.protocol.responses import ResponsesRequest
from glmserve.server.dialects import ANTHROPIC_API, OPENAI_API, RESPONSES_API, Dialect
from glmserve.serving.responses.stored import ResponseStorage

if TYPE_CHECKING:
    from glmserve.runtime.loaded import LoadedModel


@dataclass(frozen=True)
class Call:
    """Who runs a request and how: ``owner`` (the key's digest, ``server/auth.owner``), the
    app's ``storage`` (stored responses), and ``batch``: a batch line (whole answers at
    ``BATCH_PRIORITY``) rather than an HTTP request (streams encoded for the wire)."""

    owner: str
    storage: ResponseStorage
    batch: bool = False

    @property
    def priority(self) -> int:
        return BATCH_PRIORITY if self.batch else INTERACTIVE_PRIORITY


@dataclass(frozen=True)
class Endpoint:
    """``path``; ``request``: its request model; ``run(loaded, request, call)``: the answer
    (a reply model, or a stream of items); ``dialect``: the API it speaks; ``generation``: it
    holds a generation slot of its model (embeddings do not)."""

    path: str
    request: type[BaseModel]
    run: Callable[[LoadedModel, Any, Call], Awaitable[Any]]
    dialect: Dialect
    generation: bool = True


ENDPOINTS: dict[str, Endpoint] = {e.path: e for e in (
    Endpoint("/v1/chat/completions", ChatCompletionRequest,
             lambda loaded, req, c: loaded.chat.create(req, priority=c.priority, encoded=not c.batch), OPENAI_API),
    Endpoint("/v1/completions", CompletionRequest,
             lambda loaded, req, c: loaded.completions.create(req, c.priority), OPENAI_API),
    Endpoint("/v1/responses", ResponsesRequest,
             lambda loaded, req, c: c.storage.create(loaded.responses, req, c.owner, c.priority,
                                                     encoded=not c.batch), RESPONSES_API),
    Endpoint("/v1/embeddings", EmbeddingRequest, lambda loaded, req, c: loaded.embeddings.create(req), OPENAI_API,
             generation=False),
    Endpoint("/v1/messages", MessagesRequest,
             lambda loaded, req, c: loaded.messages.create(req, c.priority, encoded=not c.batch), ANTHROPIC_API),
)}


def dialect_of(path: str) -> Dialect:
    """The dialect of the API ``path`` belongs to: the ``ENDPOINTS`` row's whose path it is or
    is below (``/v1/messages/count_tokens``, ``/v1/responses/{id}``), else OpenAI's."""
    for endpoint in ENDPOINTS.values():
        if path == endpoint.path or path.startswith(endpoint.path + "/"):
            return endpoint.dialect
    return OPENAI_API
