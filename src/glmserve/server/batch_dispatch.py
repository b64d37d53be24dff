"""A batch line run as its HTTP route would run it: the same request model (strict, parsed
from JSON) and the same run (``server/endpoints.ENDPOINTS``), the same error bodies (OpenAI's,
or Anthropic's for ``/v1/messages``), without a connection, at the engines' batch priority. A handler that raises
anything but an ``APIError`` answers a 500 ``internal_error`` body (recorded as the line's
result, once). ``dispatcher(app)`` is what the batch runner calls."""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from glmserve.protocol.errors import APIError
from glmserve.server.endpoints import ENDPOINTS, Call
from glmserve.server.errors import error_content, validation_error
from glmserve.server.model_lease import lease_for
from glmserve.serving.batches.runner import Dispatch

log = logging.getLogger("glmserve.batches")


def dispatcher(app: FastAPI) -> Dispatch:
    """``dispatch(owner, url, body) -> (status, body)`` over ``app``'s models and stores."""

    async def dispatch(owner: str, url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        try:
            endpoint = ENDPOINTS[url]
            try:
                req = endpoint.request.model_validate_json(json.dumps(body))
            except ValidationError as exc:
                raise validation_error(RequestValidationError(exc.errors())) from None
            if getattr(req, "background", False):
                raise APIError(400, "background is not served in a batch", "invalid_request_error", "background")
            async with await lease_for(app, owner, req, endpoint.generation) as lease:  # as a route's
                result = await endpoint.run(lease.loaded, req, Call(owner, app.state.responses_storage, batch=True))
            return 200, endpoint.dialect.stream.dump(result)
        except APIError as exc:
            return error_content(exc, url)
        except Exception:  # noqa: BLE001 (a line that breaks the handler is recorded as failed, once)
            log.exception("a batch line to %s failed", url)
            return error_content(APIError(500, "The server had an error while processing this request.",
                                          "server_error", None, "internal_error"), url)

    return dispatch
