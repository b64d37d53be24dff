"""How a route reaches the model a request names: a lease on its loaded model (loading it if needed),
held for as long as the answer needs the model (a stream: until it is closed)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from fastapi import Request, Response

from glmserve.server.auth import cache_owner, owner
from glmserve.server.endpoints import ENDPOINTS, Call
from glmserve.server.sse import SSEDialect, respond
from glmserve.serving.generation.request_scope import CACHE_SALT
from glmserve.serving.generation.request_scope import cache_salt as salt_for

if TYPE_CHECKING:
    from glmserve.runtime.loaded import LoadedModel


async def respond_with_model(request: Request, model: str | None, call: Callable[[LoadedModel], Awaitable[Any]],
                             dialect: SSEDialect, keep_alive: float | None = None,
                             cache_salt: str | None = None) -> Response:
    """``respond(call(loaded))`` in ``dialect`` on the loaded serving ``model``, released when
    the response no longer needs it: the routes that generate text. ``cache_salt``: the client's (its
    request's field); the engine's salt also keeps keys apart (``serving/generation/request_scope.py``).
    Raises ``APIError`` when the model is unknown, cannot be loaded, or is served for
    embeddings only."""
    scope_cache(request, cache_salt)
    lease = await request.app.state.models.acquire(model, keep_alive, generation=True)
    leave = request.app.state.activity.enter()  # batch work yields while it is in flight

    def release() -> None:
        lease.release()
        leave()

    try:
        result = call(lease.loaded)
    except BaseException:
        release()
        raise
    return await respond(result, request, dialect, release=release)


def scope_cache(request: Request, client_salt: str | None) -> None:
    """Set the engine's cache salt (``serving/generation/request_scope.py``) for this request's task, and the
    tasks it starts (a background response)."""
    CACHE_SALT.set(salt_for(cache_owner(request.app, owner(request)), client_salt))


def http_call(request: Request) -> Call:
    """An HTTP request's ``Call`` (``server/endpoints.py``): its key's owner and the app's storage."""
    return Call(owner(request), request.app.state.responses_storage)


async def respond_with_endpoint(request: Request, path: str, body: Any) -> Response:
    """``respond_with_model`` running ``ENDPOINTS[path]`` for ``body`` (its request model), in
    the row's dialect."""
    endpoint, call = ENDPOINTS[path], http_call(request)
    return await respond_with_model(request, body.model, lambda loaded: endpoint.run(loaded, body, call),
                                    endpoint.dialect.stream,
                                    keep_alive=getattr(body, "keep_alive", None),
                                    cache_salt=getattr(body, "cache_salt", None))


@asynccontextmanager
async def leased_model(request: Request, model: str | None,
                       keep_alive: float | None = None) -> AsyncIterator[LoadedModel]:
    """The loaded model serving ``model`` (None: the default model), held inside the block."""
    async with await request.app.state.models.acquire(model, keep_alive) as lease:
        yield lease.loaded
