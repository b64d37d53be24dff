"""How a request reaches the model it names (``lease_for``, the same for a route, a batch line
and a background run): a lease on its loaded model (loading it if needed) with the engine's cache
salt set, held for as long as the answer needs the model (a stream: until it is closed)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request, Response

from glmserve.server.auth import cache_owner, check_keep_alive, owner
from glmserve.server.endpoints import ENDPOINTS, Call
from glmserve.server.sse import respond
from glmserve.serving.generation.request_scope import CACHE_SALT, OWNER, TENANT
from glmserve.serving.generation.request_scope import cache_salt as salt_for

if TYPE_CHECKING:
    from glmserve.runtime.loaded import LoadedModel
    from glmserve.runtime.registry_types import Lease


async def lease_for(app: FastAPI, owner_digest: str, body: Any, generation: bool = True) -> Lease:
    """A request's setup, one for a route, a batch line and a background run: the engine's cache
    salt set for this task and the tasks it starts (``owner_digest``'s scope and the body's
    ``cache_salt``), and the tenant whose turn it is (``serving/generation/request_scope.py``),
    then a lease on the loaded model ``body.model`` names (the base model, an alias or a LoRA adapter, loading it if needed; the
    body's ``keep_alive``). ``generation``: the model must generate text (not one served for
    embeddings only). Raises ``APIError`` when the model is unknown, cannot be loaded, or is
    served for embeddings only where it must generate, and ``check_keep_alive``'s 403."""
    check_keep_alive(app, owner_digest, getattr(body, "keep_alive", None))
    tenant = cache_owner(app, owner_digest)
    CACHE_SALT.set(salt_for(tenant, getattr(body, "cache_salt", None)))
    TENANT.set(tenant)
    OWNER.set(owner_digest)
    return await app.state.model_router.acquire(body.model, getattr(body, "keep_alive", None), generation=generation)


def http_call(request: Request) -> Call:
    """An HTTP request's ``Call`` (``server/endpoints.py``): its key's owner and the app's storage."""
    return Call(owner(request), request.app.state.responses_storage)


async def respond_with_endpoint(request: Request, path: str, body: Any) -> Response:
    """``ENDPOINTS[path]`` run for ``body`` (its request model) on its leased model
    (``lease_for``) and answered in the row's dialect; the model is released when the response
    no longer needs it (a stream: once it is closed)."""
    endpoint, call = ENDPOINTS[path], http_call(request)
    lease = await lease_for(request.app, call.owner, body, endpoint.generation)
    leave = request.app.state.activity.enter()  # batch work yields while it is in flight

    def release() -> None:
        lease.release()
        leave()

    try:
        result = endpoint.run(lease.loaded, body, call)
    except BaseException:
        release()
        raise
    return await respond(result, request, endpoint.dialect.stream, release=release)


@asynccontextmanager
async def leased_model(request: Request, model: str | None,
                       keep_alive: float | None = None) -> AsyncIterator[LoadedModel]:
    """The loaded model serving ``model`` (None: the default model), held inside the block.
    Raises ``check_keep_alive``'s 403."""
    check_keep_alive(request.app, owner(request), keep_alive)
    async with await request.app.state.model_router.acquire(model, keep_alive) as lease:
        yield lease.loaded
