"""OpenAI's generation endpoints that keep no state: ``POST /v1/chat/completions``,
``POST /v1/completions`` and ``POST /v1/embeddings``, each a row of ``server/endpoints.ENDPOINTS``
(what a batch line runs too)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from glmserve.protocol.chat import ChatCompletion, ChatCompletionRequest
from glmserve.protocol.completions import Completion, CompletionRequest
from glmserve.protocol.embeddings import EmbeddingRequest, EmbeddingResponse
from glmserve.server.endpoints import ENDPOINTS
from glmserve.server.model_lease import http_call, leased_model, respond_with_endpoint
from glmserve.server.openapi import error_responses

router = APIRouter()


@router.post("/v1/chat/completions", responses={
    200: {"model": ChatCompletion, "description": "The completion; with `stream: true`, server-sent events of "
          "`chat.completion.chunk` objects, then `data: [DONE]`", "content": {"text/event-stream": {}}},
    **error_responses(400, 404, 408, 413, 429, 500, 503),
})
async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> Response:
    return await respond_with_endpoint(request, "/v1/chat/completions", body)


@router.post("/v1/completions", responses={
    200: {"model": Completion, "description": "The completion; with `stream: true`, server-sent events of "
          "`text_completion` objects, then `data: [DONE]`", "content": {"text/event-stream": {}}},
    **error_responses(400, 404, 408, 413, 429, 500, 503),
})
async def create_completion(body: CompletionRequest, request: Request) -> Response:
    return await respond_with_endpoint(request, "/v1/completions", body)


@router.post("/v1/embeddings", responses=error_responses(400, 404, 408, 413, 500, 503))
async def create_embeddings(body: EmbeddingRequest, request: Request) -> EmbeddingResponse:
    async with leased_model(request, body.model, body.keep_alive) as loaded:
        return await ENDPOINTS["/v1/embeddings"].run(loaded, body, http_call(request))
