"""``POST /v1/completions``."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from glmserve.protocol.completions import Completion, CompletionRequest
from glmserve.server.openapi import error_responses
from glmserve.server.model_lease import respond_with_endpoint

router = APIRouter()


@router.post("/v1/completions", responses={
    200: {"model": Completion, "description": "The completion; with `stream: true`, server-sent events of "
          "`text_completion` objects, then `data: [DONE]`", "content": {"text/event-stream": {}}},
    **error_responses(400, 404, 408, 413, 429, 500, 503),
})
async def create_completion(body: CompletionRequest, request: Request) -> Response:
    return await respond_with_endpoint(request, "/v1/completions", body)
