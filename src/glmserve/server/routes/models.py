"""``GET /v1/models`` and ``GET /v1/models/{id}``."""

from __future__ import annotations

from fastapi import APIRouter, Request

from glmserve.protocol.errors import model_not_found
from glmserve.protocol.models import ModelCard, ModelList
from glmserve.server.openapi import error_responses

router = APIRouter()


@router.get("/v1/models")
async def list_models(request: Request) -> ModelList:
    return ModelList(data=request.app.state.model_router.cards())


@router.get("/v1/models/{model_id:path}", responses=error_responses(404))
async def retrieve_model(model_id: str, request: Request) -> ModelCard:
    for card in request.app.state.model_router.cards():
        if card.id == model_id:
            return card
    raise model_not_found(model_id)
