"""``POST /v1/messages`` and ``POST /v1/messages/count_tokens`` (Anthropic's Messages API;
its dialect, Anthropic's, from its ``ENDPOINTS`` row)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request, Response

from glmserve.protocol.anthropic import CountTokensRequest, CountTokensResponse, Message, MessagesRequest
from glmserve.server.openapi import error_responses
from glmserve.server.model_lease import leased_model, respond_with_endpoint
from glmserve.server.endpoints import dialect_of

router = APIRouter()
MESSAGES = dialect_of("/v1/messages")


@router.post("/v1/messages", responses={
    200: {"model": Message, "description": "The message; with `stream: true`, server-sent events "
          "(`message_start` ... `message_stop`)", "content": {"text/event-stream": {}}},
    **error_responses(400, 404, 408, 413, 429, 500, 529, dialect=MESSAGES),
})
async def create_message(body: MessagesRequest, request: Request) -> Response:
    return await respond_with_endpoint(request, "/v1/messages", body)


@router.post("/v1/messages/count_tokens", responses=error_responses(400, 404, 413, dialect=MESSAGES))
async def count_tokens(body: CountTokensRequest, request: Request) -> CountTokensResponse:
    async with leased_model(request, body.model, body.keep_alive) as loaded:
        return await asyncio.to_thread(loaded.messages.count_tokens, body)
