"""``/v1/conversations`` (OpenAI's Conversations API), over ``serving/responses/conversations.py``; each
conversation belongs to the API key that made it (``server/auth.owner``)."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Query, Request

from glmserve.protocol.conversations import ConversationCreateRequest, ConversationUpdateRequest, ItemsCreateRequest
from glmserve.server.auth import owner
from glmserve.server.errors import ASCIIJSONResponse as JSONResponse
from glmserve.server.openapi import error_responses
from glmserve.serving.responses.conversations import ConversationService

router = APIRouter()


def _service(request: Request) -> ConversationService:
    return request.app.state.responses_storage.conversations


@router.post("/v1/conversations", responses=error_responses(400, 404))
async def create_conversation(body: ConversationCreateRequest, request: Request) -> JSONResponse:
    return JSONResponse(await _service(request).create(body, owner(request)))


@router.get("/v1/conversations/{conversation_id}", responses=error_responses(404))
async def get_conversation(conversation_id: str, request: Request) -> JSONResponse:
    return JSONResponse(await _service(request).get(conversation_id, owner(request)))


@router.post("/v1/conversations/{conversation_id}", responses=error_responses(400, 404))
async def update_conversation(conversation_id: str, body: ConversationUpdateRequest, request: Request) -> JSONResponse:
    return JSONResponse(await _service(request).update(conversation_id, owner(request), body.metadata))


@router.delete("/v1/conversations/{conversation_id}", responses=error_responses(404))
async def delete_conversation(conversation_id: str, request: Request) -> JSONResponse:
    return JSONResponse(await _service(request).delete(conversation_id, owner(request)))


@router.post("/v1/conversations/{conversation_id}/items", responses=error_responses(400, 404))
async def add_items(conversation_id: str, body: ItemsCreateRequest, request: Request) -> JSONResponse:
    return JSONResponse(await _service(request).add_items(conversation_id, owner(request), body))


@router.get("/v1/conversations/{conversation_id}/items", responses=error_responses(400, 404))
async def list_items(conversation_id: str, request: Request, after: str | None = None,
                     limit: int = Query(20, ge=1, le=100), order: Literal["asc", "desc"] = "desc",
                     include: list[str] = Query([])) -> JSONResponse:  # noqa: B008 (FastAPI's query list)
    return JSONResponse(await _service(request).list_items(conversation_id, owner(request), after, limit, order))


@router.get("/v1/conversations/{conversation_id}/items/{item_id}", responses=error_responses(404))
async def get_item(conversation_id: str, item_id: str, request: Request) -> JSONResponse:
    return JSONResponse(await _service(request).get_item(conversation_id, owner(request), item_id))


@router.delete("/v1/conversations/{conversation_id}/items/{item_id}", responses=error_responses(404))
async def delete_item(conversation_id: str, item_id: str, request: Request) -> JSONResponse:
    return JSONResponse(await _service(request).delete_item(conversation_id, owner(request), item_id))
