"""A batch line run as its HTTP route would run it: the same request model (strict, parsed
from JSON), the same services, the same error bodies (OpenAI's, or Anthropic's for
``/v1/messages``), without a connection, at the engines' batch priority. A handler that raises
anything but an ``APIError`` answers a 500 ``internal_error`` body (recorded as the line's
result, once). ``dispatcher(app)`` is what the batch runner calls."""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from glmserve.protocol.anthropic import MessagesRequest
from glmserve.protocol.chat import ChatCompletionRequest
from glmserve.protocol.completions import CompletionRequest
from glmserve.protocol.embeddings import EmbeddingRequest
from glmserve.protocol.errors import APIError
from glmserve.protocol.responses import ResponsesRequest
from glmserve.server.auth import cache_owner
from glmserve.server.errors import error_content, validation_error
from glmserve.serving.batches.runner import Dispatch
from glmserve.engine.types import BATCH_PRIORITY
from glmserve.serving.generation.request_scope import CACHE_SALT, cache_salt

log = logging.getLogger("glmserve.batches")

_MODELS: dict[str, type[BaseModel]] = {
    "/v1/chat/completions": ChatCompletionRequest, "/v1/completions": CompletionRequest,
    "/v1/responses": ResponsesRequest, "/v1/embeddings": EmbeddingRequest, "/v1/messages": MessagesRequest,
}


def dispatcher(app: FastAPI) -> Dispatch:
    """``dispatch(owner, url, body) -> (status, body)`` over ``app``'s models and stores."""

    async def dispatch(owner: str, url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        try:
            try:
                req = _MODELS[url].model_validate_json(json.dumps(body))
            except ValidationError as exc:
                raise validation_error(RequestValidationError(exc.errors())) from None
            # the engine's cache salt, as the route's (server/model_lease.py)
            CACHE_SALT.set(cache_salt(cache_owner(app, owner), getattr(req, "cache_salt", None)))
            generation = url != "/v1/embeddings"
            async with await app.state.models.acquire(req.model, getattr(req, "keep_alive", None),
                                                      generation=generation) as lease:
                runtime = lease.runtime
                if url == "/v1/chat/completions":
                    result = await runtime.chat.create(req, priority=BATCH_PRIORITY)
                elif url == "/v1/completions":
                    result = await runtime.completions.create(req, BATCH_PRIORITY)
                elif url == "/v1/embeddings":
                    result = await runtime.embeddings.create(req)
                elif url == "/v1/messages":
                    result = await runtime.messages.create(req, BATCH_PRIORITY)
                else:
                    if req.background:
                        raise APIError(400, "background is not served in a batch", "invalid_request_error",
                                       "background")
                    result = await app.state.responses_storage.create(runtime.responses, req, owner, BATCH_PRIORITY)
            dump = result.model_dump() if url in ("/v1/responses", "/v1/messages") else \
                result.model_dump(exclude_none=True)
            return 200, dump
        except APIError as exc:
            return error_content(exc, url)
        except Exception:  # noqa: BLE001 (a line that breaks the handler is recorded as failed, once)
            log.exception("a batch line to %s failed", url)
            return error_content(APIError(500, "The server had an error while processing this request.",
                                          "server_error", None, "internal_error"), url)

    return dispatch
