"""``POST /v1/chat/completions``."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from glmserve.protocol.chat import ChatCompletion, ChatCompletionRequest
from glmserve.server.cancellation import with_cancellation
from glmserve.server.openapi import error_responses
from glmserve.server.sse import event_stream

router = APIRouter()


@router.post("/v1/chat/completions", responses={
    200: {"model": ChatCompletion, "description": "The completion; with `stream: true`, server-sent events of "
          "`chat.completion.chunk` objects, then `data: [DONE]`", "content": {"text/event-stream": {}}},
    **error_responses(400, 404, 408, 413, 429, 500),
})
async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> Response:
    result = await with_cancellation(request.app.state.chat.create(body), request)
    if result is None:  # client went away; nobody reads this
        return Response(status_code=499)
    if isinstance(result, ChatCompletion):
        return JSONResponse(result.model_dump(exclude_none=True))
    return event_stream(result, request.app.state.shutdown_timeout)
