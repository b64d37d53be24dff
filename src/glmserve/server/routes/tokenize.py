"""``POST /tokenize``, ``POST /detokenize`` (vLLM's routes and shapes)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request

from glmserve.protocol.tokenize import DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse
from glmserve.server.model_lease import leased_model
from glmserve.server.openapi import error_responses

router = APIRouter()


@router.post("/tokenize", responses=error_responses(400, 404, 413))
async def tokenize(body: TokenizeRequest, request: Request) -> TokenizeResponse:
    async with leased_model(request, body.model) as loaded:
        return await asyncio.to_thread(loaded.tokenize.tokenize, body)


@router.post("/detokenize", responses=error_responses(400, 404, 413))
async def detokenize(body: DetokenizeRequest, request: Request) -> DetokenizeResponse:
    async with leased_model(request, body.model) as loaded:
        return await asyncio.to_thread(loaded.tokenize.detokenize, body)
