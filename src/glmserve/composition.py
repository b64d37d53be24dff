"""The composition root: settings -> the started models -> the HTTP app serving them
(``build_app``), the one app that ``glmserve serve`` and each Ray Serve replica run.

The layers below it (``server`` over ``runtime.loaded.LoadedModel`` and ``runtime.router.ModelRouter``,
over ``serving`` and the engines) never import this module, and nothing under ``server`` imports
``glmserve.runtime.start``: every import arrow points down (``tests/unit/test_import_graph.py``
keeps it so)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import FastAPI

from glmserve.runtime.start import freeze_heap, serve_many, start_model
from glmserve.server import AppOptions, create_app
from glmserve.runtime.router import ModelRouter
from glmserve.serving.batches.service import BatchService
from glmserve.serving.responses.conversations import ConversationService
from glmserve.serving.responses.sealed_reasoning import ReasoningSeal
from glmserve.serving.responses.stored import ResponseStorage
from glmserve.settings.serve import ServeSettings
from glmserve.state import BatchStore, ConversationStore, FileStore, ResponseStore, open_database


def build_app(settings: ServeSettings, replica_id: str | None = None,
              deployment_health: Callable[[], Awaitable[dict]] | None = None) -> FastAPI:
    """Start the engine and return the HTTP app serving it (the app shuts the engine down on
    exit): the one app that ``glmserve serve`` and each Ray Serve replica run.

    ``replica_id``, ``deployment_health``: see ``server.AppOptions``. Raises one of
    ``STARTUP_ERRORS`` as ``start_model`` does (``DatabaseError``: the state database cannot
    be opened), before any engine starts."""
    ttl_s = settings.store_ttl_s()
    database = open_database(settings.state_database_url(), private_folder=settings.database_url is None)
    keys = {*settings.api_key, *settings.admin_api_key}  # the owners of what is stored (one: no key)
    store = ResponseStore(database, ttl_s, settings.store_max_bytes, settings.store_max_bytes_per_key, len(keys))
    seal = ReasoningSeal(settings.state_dir)  # the key of encrypted reasoning, one for all models
    loaded = start_model(settings, seal=seal)
    served = ModelRouter.single(loaded)
    if settings.many_models:
        try:
            served = serve_many(settings, loaded, seal)
        except BaseException:
            loaded.shutdown()
            raise
    app = create_app(served, AppOptions(
        api_key=settings.api_key, admin_api_key=settings.admin_api_key, shutdown_timeout=settings.shutdown_timeout,
        max_request_bytes=settings.max_request_bytes, client_body_timeout=settings.client_body_timeout,
        allowed_origins=settings.allowed_origins, replica_id=replica_id, deployment_health=deployment_health,
        ui=settings.ui, runtime_lora=settings.allow_runtime_lora_updating,
        storage=ResponseStorage(store, ConversationService(ConversationStore(store))),
        purge_interval_s=min(3600.0, ttl_s / 10),
        batch_service=BatchService(BatchStore(database, store.quota), FileStore(store)),
        batch_lease_s=settings.batch_lease_s()))
    freeze_heap()  # what start-up made lives as long as the process
    return app
