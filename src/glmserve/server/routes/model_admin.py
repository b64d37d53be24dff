"""``POST /models/load``, ``POST /models/unload`` and ``GET /models/events`` (llama-server's
router-mode routes): load or unload a model of a server of several by hand, and follow every
model's status (``loading``, ``loaded``, ``unloaded``, with the last load error) as server-sent
events, which the web page's model picker shows."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from pydantic import BaseModel
from sse_starlette import EventSourceResponse

from glmserve.protocol.chat import _Lenient
from glmserve.protocol.errors import invalid_request
from glmserve.runtime.registry import ModelLoadError, RegistryFull, UnknownModel
from glmserve.runtime.router import registry_error
from glmserve.server.openapi import error_responses

router = APIRouter()


class ModelRequest(_Lenient):
    model: str


class ModelState(BaseModel):
    model: str
    status: str


@router.post("/models/load", responses=error_responses(400, 404, 500, 503))
async def load_model(body: ModelRequest, request: Request) -> ModelState:
    registry = request.app.state.model_router.registry
    try:
        await registry.load(body.model)
        name = registry.resolve(body.model)
    except (UnknownModel, ModelLoadError, RegistryFull) as exc:
        raise registry_error(exc) from exc
    return ModelState(model=name, status="loaded")


@router.post("/models/unload", responses=error_responses(400, 404, 503))
async def unload_model(body: ModelRequest, request: Request) -> ModelState:
    """Unloads once the model's running requests end (a 503 if they do not within the
    registry's wait); answers the model's status after it (``unloaded``; ``loaded`` when a
    request loaded it again meanwhile). The server's only model is never unloaded (a 400)."""
    registry = request.app.state.model_router.registry
    try:
        if registry.pinned(body.model):
            raise invalid_request(f"model '{registry.resolve(body.model)}' is this server's only model and is never "
                                  "unloaded", "model")
        await registry.unload(body.model)
        name = registry.resolve(body.model)
    except (UnknownModel, RegistryFull) as exc:
        raise registry_error(exc) from exc
    return ModelState(model=name, status=registry.status_of(name))


@router.get("/models/events", response_class=EventSourceResponse, responses={
    200: {"description": "Server-sent events, one JSON object per status change: {model, status, error}; "
          "first the status of every model", "content": {"text/event-stream": {}}}})
async def model_events(request: Request) -> EventSourceResponse:
    registry = request.app.state.model_router.registry

    async def events() -> AsyncIterator[str]:
        queue = registry.subscribe()  # here, so that a stream never read never subscribes
        try:
            while True:
                yield json.dumps(await queue.get())
        finally:
            registry.unsubscribe(queue)

    return EventSourceResponse(events(), ping=15)
