"""``POST /v1/chat/completions``."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from glmserve.protocol.chat import ChatCompletion, ChatCompletionRequest
from glmserve.server.openapi import error_responses
from glmserve.server.model_lease import respond_with_endpoint

router = APIRouter()


@router.post("/v1/chat/completions", responses={
    200: {"model": ChatCompletion, "description": "The completion; with `stream: true`, server-sent events of "
          "`chat.completion.chunk` objects, then `data: [DONE]`", "content": {"text/event-stream": {}}},
    **error_responses(400, 404, 408, 413, 429, 500, 503),
})
async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> Response:
    return await respond_with_endpoint(request, "/v1/chat/completions", body)
