"""``create_app``: the FastAPI application around the served models."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import Depends, FastAPI
from starlette.middleware.cors import CORSMiddleware

from glmserve.version import __version__
from glmserve.server.auth import require_admin_key, require_api_key
from glmserve.server.key_gate import KeyGate
from glmserve.server.endpoints import dialect_of
from glmserve.server.errors import install_error_handlers
from glmserve.server.limits import BodyLimits
from glmserve.server.openapi import error_responses, install_openapi
from glmserve.server.request_id import RequestId
from glmserve.server.batch_dispatch import dispatcher
from glmserve.server.routes import (batches, conversations, docs, health, lora, messages, metrics, model_admin,
                                    models, openai, responses, tokenize)
from glmserve.server.routes.ui import install_ui
from glmserve.serving.batches.runner import Activity, BatchRunner
from glmserve.serving.batches.service import BatchService
from glmserve.runtime.router import ModelRouter
from glmserve.serving.responses.stored import ResponseStorage


@dataclass(frozen=True)
class AppOptions:
    """What ``create_app`` serves besides the models (``composition.build_app`` fills it from
    the serve settings; every field has the default of a bare app, as the unit tests make it).

    - ``api_key``: every route but ``/health`` (and the web page) needs one of these keys
      (``/docs`` and ``/redoc`` are off then); ``admin_api_key``: keys that alone may call the
      admin routes (model load and unload, LoRA load and unload, ``/models/events``,
      ``/metrics``: ``server/auth.require_admin_key``) and every other route (none: every key
      is an admin);
    - ``shutdown_timeout``: seconds open streams may run on after SIGTERM;
      ``max_request_bytes``: bodies over it get a 413; ``client_body_timeout``: bodies that
      stall this many seconds get a 408; ``allowed_origins``: browser origins allowed by CORS
      (none: no CORS headers);
    - ``replica_id`` (a Ray Serve replica): sent as ``x-glmserve-replica`` on every response;
      ``deployment_health``: adds the deployment's state to ``/health``;
    - ``ui``: serve the web chat page at ``/`` (``server/routes/ui.py``); ``runtime_lora``:
      mount ``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter``;
    - ``storage``: stored responses (default: none kept), its expired ones deleted every
      ``purge_interval_s`` seconds; ``batch_service``: files and batches (default: none kept),
      whose lines a ``BatchRunner`` runs while the app runs, each claimed for ``batch_lease_s``
      seconds at a time."""

    api_key: str | Sequence[str] | None = None
    admin_api_key: Sequence[str] = ()
    shutdown_timeout: float = 30.0
    max_request_bytes: int = 64 * 1024 * 1024
    client_body_timeout: float = 30.0
    allowed_origins: Sequence[str] = ()
    replica_id: str | None = None
    deployment_health: Callable[[], Awaitable[dict]] | None = None
    ui: bool = True
    runtime_lora: bool = False
    storage: ResponseStorage | None = None
    purge_interval_s: float = 3600.0
    batch_service: BatchService | None = None
    batch_lease_s: float = 30.0


def create_app(models_served: ModelRouter, options: AppOptions = AppOptions()) -> FastAPI:
    """The app serving the models of ``models_served`` (a registry's, or one started model's:
    ``ModelRouter.single``), with ``options`` (``AppOptions``); unloads the models on exit.
    Every response carries ``x-request-id``."""
    o = options
    admin_keys = tuple(o.admin_api_key)
    keys = ((o.api_key,) if isinstance(o.api_key, str) else tuple(o.api_key or ())) + admin_keys
    stored = o.storage or ResponseStorage(None)
    batch_work = o.batch_service or BatchService(None, None)
    activity = Activity()

    def capacity() -> int:  # the engines' full batch size
        return max((r.engine.model_info.max_num_seqs or 1 for r in models_served.loaded_models().values()), default=1)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        tasks = []
        if stored.store:
            tasks.append(asyncio.create_task(stored.purge_forever(o.purge_interval_s)))
            tasks.append(asyncio.create_task(stored.runs.heartbeat_forever()))
        runner = None
        if batch_work.batches is not None:
            runner = BatchRunner(batch_work, dispatcher(app), capacity, activity, models=models_served.names,
                                 lease_s=o.batch_lease_s)
            tasks.append(asyncio.create_task(runner.run_forever()))
        yield
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if runner is not None:
            await runner.close()
        await stored.runs.close()
        await models_served.close()

    app = FastAPI(title="glmserve", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.api_keys = keys
    app.state.admin_keys = admin_keys
    app.state.responses_storage = stored
    app.state.batches = batch_work
    app.state.activity = activity
    app.state.model_router = models_served
    app.state.replica_id = o.replica_id
    app.state.deployment_health = o.deployment_health
    app.state.shutdown_timeout = o.shutdown_timeout
    install_error_handlers(app)
    install_openapi(app)
    # the last added is the outermost: request id, then CORS, then the key, then the body limits
    app.add_middleware(BodyLimits, max_bytes=o.max_request_bytes, timeout_s=o.client_body_timeout)
    app.add_middleware(KeyGate)
    if o.allowed_origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(o.allowed_origins), allow_methods=["GET", "POST"],
                           allow_headers=["*"], expose_headers=["x-request-id", "retry-after"])
    app.add_middleware(RequestId, replica_id=o.replica_id)
    app.include_router(health.router)
    protected = [Depends(require_api_key)]
    needs_key = error_responses(401)
    app.include_router(docs.spec_router, dependencies=protected)
    if not keys:
        app.include_router(docs.pages_router)
    app.include_router(models.router, dependencies=protected, responses=needs_key)
    admin = [Depends(require_admin_key)]
    needs_admin = error_responses(401, 403)
    if len(models_served.registry.status()) > 1:
        app.include_router(model_admin.router, dependencies=admin, responses=needs_admin)
    app.include_router(openai.router, dependencies=protected, responses=needs_key)
    app.include_router(responses.router, dependencies=protected, responses=needs_key)
    app.include_router(conversations.router, dependencies=protected, responses=needs_key)
    # Anthropic's routes (the Messages API and its batches) take its key header and its envelope
    anthropic = dialect_of("/v1/messages")
    anthropic_key = [Depends(anthropic.key)]
    app.include_router(messages.router, dependencies=anthropic_key, responses=error_responses(401, dialect=anthropic))
    app.include_router(batches.router, dependencies=protected, responses=needs_key)
    app.include_router(batches.anthropic_router, dependencies=anthropic_key,
                       responses=error_responses(401, dialect=anthropic))
    app.include_router(tokenize.router, dependencies=protected, responses=needs_key)
    if o.runtime_lora:
        app.include_router(lora.router, dependencies=admin, responses=needs_admin)
    app.include_router(metrics.router, dependencies=admin, responses=needs_admin)
    if o.ui:
        install_ui(app)
    return app

