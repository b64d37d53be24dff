"""``POST /v1/load_lora_adapter``, ``POST /v1/unload_lora_adapter`` (vLLM's routes; mounted only
with ``--allow-runtime-lora-updating``, as vLLM mounts them only with
``VLLM_ALLOW_RUNTIME_LORA_UPDATING``)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse

from glmserve.protocol.lora import LoadLoRAAdapterRequest, UnloadLoRAAdapterRequest
from glmserve.server.model_lease import leased_model
from glmserve.server.openapi import error_responses

router = APIRouter()


@router.post("/v1/load_lora_adapter", response_class=PlainTextResponse, responses=error_responses(400, 413))
async def load_lora_adapter(body: LoadLoRAAdapterRequest, request: Request) -> str:
    async with leased_model(request, body.model) as loaded:
        return await loaded.lora.load(body)


@router.post("/v1/unload_lora_adapter", response_class=PlainTextResponse, responses=error_responses(400, 404, 413))
async def unload_lora_adapter(body: UnloadLoRAAdapterRequest, request: Request) -> str:
    async with leased_model(request, body.model) as loaded:
        return await loaded.lora.unload(body)
