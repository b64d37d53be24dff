"""``POST /v1/embeddings``."""

from __future__ import annotations

from fastapi import APIRouter, Request

from glmserve.protocol.embeddings import EmbeddingRequest, EmbeddingResponse
from glmserve.server.endpoints import ENDPOINTS
from glmserve.server.model_lease import http_call, model_runtime
from glmserve.server.openapi import error_responses

router = APIRouter()


@router.post("/v1/embeddings", responses=error_responses(400, 404, 408, 413, 500, 503))
async def create_embeddings(body: EmbeddingRequest, request: Request) -> EmbeddingResponse:
    async with model_runtime(request, body.model, body.keep_alive) as loaded:
        return await ENDPOINTS["/v1/embeddings"].run(loaded, body, http_call(request))
