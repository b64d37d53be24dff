"""``create_app``: the FastAPI application around a started engine. No engine imports here."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI

from glmserve.engine.base import Engine
from glmserve.protocol.models import ModelCard
from glmserve.server.auth import require_api_key
from glmserve.server.errors import install_error_handlers
from glmserve.server.limits import BodySizeLimit
from glmserve.server.routes import chat, health, models
from glmserve.serving.chat import ChatService


def create_app(
    engine: Engine, chat_service: ChatService, api_key: str | None = None, shutdown_timeout: float = 30.0,
    max_request_bytes: int = 64 * 1024 * 1024,
) -> FastAPI:
    """The app serving ``engine`` (already started); shuts the engine down on exit.
    ``shutdown_timeout``: seconds open streams may run on after SIGTERM; bodies over
    ``max_request_bytes`` get a 413."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        engine.shutdown()

    app = FastAPI(title="glmserve", lifespan=lifespan)
    app.state.api_key = api_key
    app.state.shutdown_timeout = shutdown_timeout
    app.state.chat = chat_service
    info, created = engine.model_info, int(time.time())
    app.state.model_cards = [
        ModelCard(id=name, created=created, owned_by=info.owned_by, max_model_len=info.context_length,
                  root=info.id, parent=None if name == chat_service.model_name else chat_service.model_name,
                  tool_call_parser=chat_service.tool_parser)
        for name in (chat_service.model_name, *info.lora_adapters)
    ]
    install_error_handlers(app)
    app.add_middleware(BodySizeLimit, max_bytes=max_request_bytes)
    app.include_router(health.router)
    protected = [Depends(require_api_key)]
    app.include_router(models.router, dependencies=protected)
    app.include_router(chat.router, dependencies=protected)
    return app
