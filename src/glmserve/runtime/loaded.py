"""``LoadedModel``: one started model and the services over it (chat, completions, responses,
messages, tokenize, embeddings, LoRA adapters), what a request for the model is served by.
Built by ``glmserve.runtime.start.start_model``; used by the server's routes and the registry of
several models (``runtime/router.py``)."""

from __future__ import annotations

from dataclasses import dataclass

from glmserve.engine import Engine
from glmserve.serving.chat.service import ChatService
from glmserve.serving.completions import CompletionService
from glmserve.serving.embeddings import EmbeddingsService
from glmserve.serving.generation.pipeline import ModelPipeline
from glmserve.serving.lora import LoRAAdapterService
from glmserve.serving.messages.service import MessagesService
from glmserve.serving.responses.service import ResponsesService
from glmserve.serving.responses.sealed_reasoning import ReasoningSeal
from glmserve.serving.tokenize import TokenizeService


@dataclass(slots=True)
class LoadedModel:
    """One started model: its engine, its ``pipeline`` (names, LoRA adapters, template, defaults,
    metrics and the generation pipeline every endpoint shares) and the endpoint services over
    it: what a request for the model is served by. The registry (``runtime/registry.py``) loads
    and unloads these; the router (``runtime/router.py``) leases them to requests."""

    engine: Engine
    pipeline: ModelPipeline
    chat: ChatService
    completions: CompletionService
    responses: ResponsesService
    messages: MessagesService
    tokenize: TokenizeService
    embeddings: EmbeddingsService
    lora: LoRAAdapterService

    @classmethod
    def over(cls, model: ModelPipeline, max_embedding_inputs: int = 2048, max_embedding_tokens: int = 32768,
             seal: ReasoningSeal | None = None) -> LoadedModel:
        """The services over ``model`` (its engine started); ``seal``: the key of
        ``/v1/responses``' ``encrypted_content`` (none: a 400 when a request asks for it)."""
        chat = ChatService(model)
        return cls(model.engine, model, chat, CompletionService(model), ResponsesService(model, chat, seal),
                   MessagesService(model, chat), TokenizeService(model),
                   EmbeddingsService(model, max_embedding_inputs, max_embedding_tokens), LoRAAdapterService(model))

    def shutdown(self) -> None:
        self.engine.shutdown()
