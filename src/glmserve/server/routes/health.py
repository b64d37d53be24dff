"""``GET /health`` (no API key needed): 200 ``{"status": "ok"}`` while the engine can serve,
503 with an OpenAI error body once it cannot (its worker or core died).

Behind Ray Serve the body also names the replica that answered and, from Ray Serve's
controller, the deployment's replicas by state (``app.state.deployment_health``)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from glmserve.engine import EngineError
from glmserve.protocol.errors import APIError
from glmserve.server.openapi import error_responses

router = APIRouter()


@router.get("/health", responses=error_responses(
    503, s503="The engine cannot serve (`engine_unhealthy`): its worker or core died"))
async def health(request: Request) -> dict[str, Any]:
    state = request.app.state
    try:
        for loaded in state.model_router.loaded_models().values():
            loaded.engine.check_health()
    except EngineError as exc:
        raise APIError(503, f"the engine cannot serve: {exc}", "server_error", None, "engine_unhealthy") from exc
    body: dict[str, Any] = {"status": "ok"}
    if state.replica_id is not None:
        body["replica"] = state.replica_id
    if state.deployment_health is not None:
        body["deployment"] = await state.deployment_health()
    return body
