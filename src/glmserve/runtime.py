"""Assemble a serving runtime from settings: engine (started), chat template, chat service;
and the HTTP app over it (``build_app``).

Shared by ``glmserve serve``, every Ray Serve replica and any in-process use, so all behave
the same.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from glmserve.chat import CHATML_TEMPLATE, ChatTemplate, ChatTemplateError
from glmserve.engine import Engine, EngineError, create_engine
from glmserve.models import ModelNotFoundError
from glmserve.multimodal import MediaPolicy
from glmserve.serving.chat import ChatService
from glmserve.serving.completions import CompletionService
from glmserve.serving.embeddings import EmbeddingsService
from glmserve.serving.lora import LoRAAdapterService
from glmserve.serving.messages import MessagesService
from glmserve.serving.responses import ResponsesService
from glmserve.serving.tokenize import TokenizeService
from glmserve.settings import ServeSettings
from glmserve.toolcalls import detect_parser

if TYPE_CHECKING:
    from fastapi import FastAPI

STARTUP_ERRORS = (EngineError, ModelNotFoundError, ChatTemplateError, OSError)


@dataclass(slots=True)
class Runtime:
    """One started model and the services over it: what a request for the model is served by."""

    engine: Engine
    chat: ChatService
    completions: CompletionService
    responses: ResponsesService
    messages: MessagesService
    tokenize: TokenizeService
    embeddings: EmbeddingsService
    lora: LoRAAdapterService

    @classmethod
    def over(cls, chat: ChatService, max_embedding_inputs: int = 2048, max_embedding_tokens: int = 32768) -> Runtime:
        """The services over ``chat``'s engine (started)."""
        return cls(chat.engine, chat, CompletionService(chat), ResponsesService(chat), MessagesService(chat),
                   TokenizeService(chat), EmbeddingsService(chat, max_embedding_inputs, max_embedding_tokens),
                   LoRAAdapterService(chat))

    def shutdown(self) -> None:
        self.engine.shutdown()


def load_chat_template(settings: ServeSettings, engine: Engine) -> ChatTemplate:
    """``--chat-template`` file, else the model's own template, else ChatML.

    Raises ``ChatTemplateError`` (does not compile) or ``OSError`` (file unreadable)."""
    info = engine.model_info
    if settings.chat_template:
        source = Path(settings.chat_template).read_text(encoding="utf-8")
    else:
        source = info.chat_template or CHATML_TEMPLATE
    return ChatTemplate(source, bos_token=info.bos_token, eos_token=info.eos_token)


def media_policy(settings: ServeSettings) -> MediaPolicy:
    """The image-fetching limits set by ``--allowed-media-domains`` and ``--max-image-*``."""
    return MediaPolicy(
        allowed_domains=frozenset(settings.allowed_media_domains),
        max_bytes=settings.max_image_bytes,
        max_pixels=settings.max_image_pixels,
        timeout_s=settings.image_fetch_timeout,
    )


def start_runtime(settings: ServeSettings) -> Runtime:
    """Build and start the engine and the services over it.

    Raises one of ``STARTUP_ERRORS`` with a one-line message when the model cannot be found or
    loaded; the engine is shut down again if a later step fails."""
    engine = create_engine(settings)
    engine.start()
    try:
        template = load_chat_template(settings, engine)
        name = settings.served_model_name or engine.model_info.id
        parser = {"auto": detect_parser(template.source), "none": None}.get(
            settings.tool_call_parser, settings.tool_call_parser)
        chat = ChatService(engine, name, template, parser, media_policy(settings), settings.schema_limits(),
                           settings.max_n, settings.default_chat_template_kwargs, settings.override_generation_config)
        return Runtime.over(chat, settings.max_embedding_inputs, settings.max_embedding_tokens)
    except BaseException:
        engine.shutdown()
        raise


def build_app(settings: ServeSettings, replica_id: str | None = None,
              deployment_health: Callable[[], Awaitable[dict]] | None = None) -> FastAPI:
    """Start the engine and return the HTTP app serving it (the app shuts the engine down on
    exit): the one app that ``glmserve serve`` and each Ray Serve replica run.

    ``replica_id``, ``deployment_health``: see ``server.create_app``. Raises one of
    ``STARTUP_ERRORS`` as ``start_runtime`` does."""
    from glmserve.server import create_app

    runtime = start_runtime(settings)
    return create_app(runtime, api_key=settings.api_key,
                      shutdown_timeout=settings.shutdown_timeout, max_request_bytes=settings.max_request_bytes,
                      client_body_timeout=settings.client_body_timeout, allowed_origins=settings.allowed_origins,
                      replica_id=replica_id, deployment_health=deployment_health, ui=settings.ui,
                      runtime_lora=settings.allow_runtime_lora_updating)
