"""The endpoints that run a model, in one table (``ENDPOINTS``): each path's request model and
how its request runs on the model's services. The HTTP routes (``server/routes/``), a batch
line's dispatch (``server/batch_dispatch.py``) and the batch route (which endpoints a batch may
name) all read it, so an endpoint is added here once (``docs/design.md``, "Adding an endpoint").

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
    (a reply model, or a stream of items); ``generation``: it holds a generation slot of its
    model (embeddings do not); ``whole``: the fields a reply model dumps in full, nulls
    included (Responses and Messages), where OpenAI's chat shapes leave unset ones out."""

    path: str
    request: type[BaseModel]
    run: Callable[[LoadedModel, Any, Call], Awaitable[Any]]
    generation: bool = True
    whole: bool = False


ENDPOINTS: dict[str, Endpoint] = {e.path: e for e in (
    Endpoint("/v1/chat/completions", ChatCompletionRequest,
             lambda rt, req, c: rt.chat.create(req, priority=c.priority, encoded=not c.batch)),
    Endpoint("/v1/completions", CompletionRequest, lambda rt, req, c: rt.completions.create(req, c.priority)),
    Endpoint("/v1/responses", ResponsesRequest,
             lambda rt, req, c: c.storage.create(rt.responses, req, c.owner, c.priority, encoded=not c.batch),
             whole=True),
    Endpoint("/v1/embeddings", EmbeddingRequest, lambda rt, req, c: rt.embeddings.create(req), generation=False),
    Endpoint("/v1/messages", MessagesRequest,
             lambda rt, req, c: rt.messages.create(req, c.priority, encoded=not c.batch), whole=True),
)}
