"""``POST /v1/responses`` (stateless)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from glmserve.protocol.responses import Response as ResponseObject
from glmserve.protocol.responses import ResponsesRequest
from glmserve.server.openapi import error_responses
from glmserve.server.model_lease import respond_with_model
from glmserve.server.sse import RESPONSES

router = APIRouter()


@router.post("/v1/responses", responses={
    200: {"model": ResponseObject, "description": "The response; with `stream: true`, server-sent events "
          "(`response.created` ... `response.completed`)", "content": {"text/event-stream": {}}},
    **error_responses(400, 404, 408, 413, 429, 500, 503),
})
async def create_response(body: ResponsesRequest, request: Request) -> Response:
    return await respond_with_model(request, body.model, lambda runtime: runtime.responses.create(body),
                                    RESPONSES, keep_alive=body.keep_alive)
