"""``/v1/messages`` (Anthropic's Messages API) on top of the chat handler, as vLLM's
``entrypoints/anthropic`` does it: request blocks become chat messages
(``serving/messages/request.py``), the chat reply stream becomes the ``message`` object or
Anthropic's stream events (``serving/messages/render.py``). Same template, tool-call parsers,
constrained decoding, limits, admission and aborts as ``/v1/chat/completions``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from glmserve.engine.types import INTERACTIVE_PRIORITY
from glmserve.protocol.anthropic import CountTokensRequest, CountTokensResponse, Message, MessagesRequest
from glmserve.protocol.errors import PromptTooLong, invalid_request
from glmserve.serving.chat.service import ChatService
from glmserve.serving.generation.chunks import ChunkStream
from glmserve.serving.generation.pipeline import ModelPipeline
from glmserve.serving.generation.reply import Reply, collect
from glmserve.serving.generation.template_vars import PRESERVED_THINKING, with_template_defaults
from glmserve.serving.messages.render import MessageEvents, message
from glmserve.serving.messages.request import thinking_mode, to_chat_request


class MessagesService:
    """Serve ``/v1/messages`` and ``/v1/messages/count_tokens`` over a ``ChatService``.
    ``create(req)`` returns a ``Message`` or, for ``stream=True``, an async iterator of
    ``MessageStreamEvent``s (with ``encoded=True`` some as ``{"event", "data"}``, the event's
    type and JSON). Client errors raise ``APIError`` before anything is generated."""

    def __init__(self, pipeline: ModelPipeline, chat: ChatService) -> None:
        self.pipeline, self.chat = pipeline, chat

    def _chat_request(self, req: CountTokensRequest):
        return with_template_defaults(to_chat_request(req, self.pipeline.engine.model_info.vision), PRESERVED_THINKING,
                                      self.pipeline.default_template_kwargs)

    def count_tokens(self, req: CountTokensRequest) -> CountTokensResponse:
        """The prompt's length in tokens (template and tools included; image tokens are not
        counted). Raises ``APIError`` as ``create`` would for the messages."""
        chat_req = self._chat_request(req)
        return CountTokensResponse(input_tokens=len(self.pipeline.prompt_token_ids(chat_req)))

    async def _reply(self, chat_req, priority: int) -> Reply:
        """The chat reply, ``max_tokens`` lowered to what the prompt leaves (Anthropic's
        ``max_tokens`` is a ceiling); a prompt that fills the context is refused in Anthropic's
        words (``prompt is too long: N tokens > M maximum``, the 400 Claude Code compacts on)."""
        try:
            return await self.chat.reply(chat_req, max_tokens_ceiling=True, priority=priority)
        except PromptTooLong as exc:
            raise invalid_request(f"prompt is too long: {exc.n_prompt} tokens > {exc.context_length - 1} maximum"
                                  ) from exc

    async def create(self, req: MessagesRequest, priority: int = INTERACTIVE_PRIORITY,
                     encoded: bool = False) -> Message | AsyncIterator:
        reply = await self._reply(self._chat_request(req), priority)
        show_thinking = thinking_mode(req) != "disabled"
        if not req.stream:
            return message(await collect(reply), req.model, show_thinking)
        return ChunkStream(MessageEvents(reply, req.model, show_thinking, encoded).events(), reply)
