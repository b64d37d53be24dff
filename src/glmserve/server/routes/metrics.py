"""``GET /metrics``: Prometheus text format (``serving/metrics.py``)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from glmserve.serving.metrics import CONTENT_TYPE

router = APIRouter()


@router.get("/metrics", response_class=Response, responses={
    200: {"description": "Prometheus text exposition format", "content": {CONTENT_TYPE: {}}}})
async def metrics(request: Request) -> Response:
    return Response(request.app.state.chat.metrics.render(), media_type=CONTENT_TYPE)
