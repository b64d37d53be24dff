"""``GET /metrics``: Prometheus text format (``serving/generation/metrics.py``), of every loaded model."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from glmserve.serving.generation.metrics import CONTENT_TYPE, render_all

router = APIRouter()


@router.get("/metrics", response_class=Response, responses={
    200: {"description": "Prometheus text exposition format", "content": {CONTENT_TYPE: {}}}})
async def metrics(request: Request) -> Response:
    loaded_models = request.app.state.model_router.loaded_models().values()
    return Response(render_all([loaded.pipeline.metrics for loaded in loaded_models]), media_type=CONTENT_TYPE)
