"""``/v1/responses``: create (``serving/responses/service.py`` generates, ``serving/responses/stored.py``
stores, continues and runs in the background), and the stored responses' routes: get (or
stream a background run again), delete, input items, cancel. Each stored response belongs to
the API key that made it (``server/auth.owner``)."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Query, Request, Response

from glmserve.protocol.responses import Response as ResponseObject
from glmserve.protocol.responses import ResponsesRequest
from glmserve.server.auth import owner
from glmserve.server.model_lease import lease_for, respond_with_endpoint
from glmserve.server.errors import ASCIIJSONResponse as JSONResponse
from glmserve.server.openapi import error_responses
from glmserve.server.endpoints import dialect_of
from glmserve.server.sse import respond
from glmserve.serving.responses.stored import ResponseStorage

router = APIRouter()
STREAM = dialect_of("/v1/responses").stream


def _storage(request: Request) -> ResponseStorage:
    return request.app.state.responses_storage


@router.post("/v1/responses", responses={
    200: {"model": ResponseObject, "description": "The response (with `background: true`, at once and `queued`); "
          "with `stream: true`, server-sent events (`response.created` ... `response.completed`)",
          "content": {"text/event-stream": {}}},
    **error_responses(400, 404, 408, 413, 429, 500, 503),
})
async def create_response(body: ResponsesRequest, request: Request) -> Response:
    storage, who = _storage(request), owner(request)
    if body.background:  # the run holds the model until it ends, not the connection
        lease = await lease_for(request.app, who, body)
        return await respond(storage.start(lease.loaded.responses, body, who, lease.release), request, STREAM)
    return await respond_with_endpoint(request, "/v1/responses", body)


@router.get("/v1/responses/{response_id}", responses={
    200: {"model": ResponseObject, "description": "The stored response; with `stream=true`, a background run's "
          "events after `starting_after`", "content": {"text/event-stream": {}}},
    **error_responses(400, 404),
})
async def get_response(response_id: str, request: Request, stream: bool = False,
                       starting_after: int = Query(-1, ge=-1),
                       include: list[str] = Query([])) -> Response:  # noqa: B008 (FastAPI's query list)
    storage, who = _storage(request), owner(request)
    if stream:
        return await respond(storage.follow(response_id, who, starting_after), request, STREAM)
    return JSONResponse(await storage.get(response_id, who))


@router.delete("/v1/responses/{response_id}", responses=error_responses(404))
async def delete_response(response_id: str, request: Request) -> JSONResponse:
    return JSONResponse(await _storage(request).delete(response_id, owner(request)))


@router.get("/v1/responses/{response_id}/input_items", responses=error_responses(400, 404))
async def list_input_items(response_id: str, request: Request, after: str | None = None,
                           limit: int = Query(20, ge=1, le=100), order: Literal["asc", "desc"] = "desc",
                           include: list[str] = Query([])) -> JSONResponse:  # noqa: B008
    return JSONResponse(await _storage(request).input_items(response_id, owner(request), after, limit, order))


@router.post("/v1/responses/{response_id}/cancel", responses={
    200: {"model": ResponseObject, "description": "The response, `cancelled` (or as it ended)"},
    **error_responses(400, 404),
})
async def cancel_response(response_id: str, request: Request) -> JSONResponse:
    return JSONResponse(await _storage(request).cancel(response_id, owner(request)))
