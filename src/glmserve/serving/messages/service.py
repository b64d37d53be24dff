"""``/v1/messages`` (Anthropic's Messages API) on top of the chat handler, as vLLM's
``entrypoints/anthropic`` does it: request blocks become chat messages, the chat completion
(or its chunks) becomes the ``message`` object (or Anthropic's stream events). Same template,
tool-call parsers, constrained decoding, limits, admission and aborts as ``/v1/chat/completions``.

Request mapping: ``serving/messages/request.py``.

Reply: ``thinking`` (GLM-4.5's ``<think>`` text), ``text`` and ``tool_use`` blocks; ``stop_reason``
``tool_use`` / ``max_tokens`` / ``stop_sequence`` (with ``stop_sequence`` set) / ``end_turn``.
Usage in Anthropic's terms: ``input_tokens`` are the prompt tokens not read from the prefix cache,
``cache_read_input_tokens`` those that were (their sum is ``count_tokens``' ``input_tokens``).

Stream (Anthropic's "Streaming messages"): ``message_start``, ``ping``, then per block
``content_block_start`` / ``content_block_delta`` (``thinking_delta``, ``text_delta``,
``input_json_delta``) / ``content_block_stop`` (one block at a time, never interleaved), then
``message_delta`` (stop reason, final usage) and ``message_stop``; a failure after the start is
an ``error`` event. The stream reads the chat stream's pieces of text as ``TextDelta``s (no chunk
objects built for them); for a caller that only sends the events (``create(encoded=True)``, the
route), a ``content_block_delta`` of the open block comes already encoded: ``{"event", "data"}``
with its JSON written from the block's template (``FilledJSON``), the event object's JSON.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

from glmserve.engine.types import INTERACTIVE_PRIORITY
from glmserve.protocol.anthropic import (
    CountTokensRequest,
    CountTokensResponse,
    Message,
    MessagesRequest,
    MessageStreamEvent,
    Usage,
    stream_error_type,
)
from glmserve.protocol.chat import ChatCompletionChunk, StreamOptions
from glmserve.protocol.chat import Usage as ChatUsage
from glmserve.protocol.errors import ErrorResponse, PromptTooLong, invalid_request
from glmserve.serving.chat.service import ChatService
from glmserve.serving.generation.pipeline import ModelPipeline
from glmserve.serving.generation.chunks import MARK, ChunkStream, ChunkWalk, FilledJSON, TextDelta
from glmserve.serving.messages.request import thinking_mode, to_chat_request
from glmserve.serving.generation.template_vars import PRESERVED_THINKING, with_template_defaults

_STOP_REASONS = {"tool_calls": "tool_use", "length": "max_tokens", "stop": "end_turn"}
# a TextDelta's kind -> the block it goes to, that block's empty start and its delta's type and field
_BLOCKS = {"content": ("text", {"type": "text", "text": ""}, "text_delta", "text"),
           "reasoning": ("thinking", {"type": "thinking", "thinking": "", "signature": ""}, "thinking_delta",
                         "thinking"),
           "arguments": ("tool_use", None, "input_json_delta", "partial_json")}


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def _usage(usage: ChatUsage | None) -> Usage:
    if usage is None:
        return Usage(input_tokens=0, output_tokens=0)
    cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0
    return Usage(input_tokens=usage.prompt_tokens - cached, cache_read_input_tokens=cached,
                 output_tokens=usage.completion_tokens)


def _stop(finish_reason: str | None, stop_string: str | None) -> tuple[str | None, str | None]:
    """``(stop_reason, stop_sequence)`` for a chat choice's finish."""
    if finish_reason == "stop" and stop_string is not None:
        return "stop_sequence", stop_string
    return _STOP_REASONS.get(finish_reason or "stop", "end_turn"), None


def _input(arguments: str) -> dict:
    """A tool call's arguments (JSON text) as a ``tool_use`` block's ``input`` object (the
    parsers give JSON objects; anything else is kept under ``arguments``)."""
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        return {"arguments": arguments}
    return value if isinstance(value, dict) else {"arguments": value}


class MessagesService:
    """Serve ``/v1/messages`` and ``/v1/messages/count_tokens`` over a ``ChatService``.
    ``create(req)`` returns a ``Message`` or, for ``stream=True``, an async iterator of
    ``MessageStreamEvent``s (with ``encoded=True`` some as ``{"event", "data"}``, the event's
    type and JSON). Client errors raise ``APIError`` before anything is generated."""

    def __init__(self, model: ModelPipeline, chat: ChatService) -> None:
        self.model, self.chat = model, chat

    def _chat_request(self, req: CountTokensRequest):
        return with_template_defaults(to_chat_request(req, self.model.engine.model_info.vision), PRESERVED_THINKING,
                                      self.model.default_template_kwargs)

    def count_tokens(self, req: CountTokensRequest) -> CountTokensResponse:
        """The prompt's length in tokens (template and tools included; image tokens are not
        counted). Raises ``APIError`` as ``create`` would for the messages."""
        chat_req = self._chat_request(req)
        self.model.check_model(chat_req.model)
        return CountTokensResponse(input_tokens=len(self.model.prompt_token_ids(chat_req)))

    async def _chat(self, chat_req, priority: int, **kw):
        """The chat service's answer, ``max_tokens`` lowered to what the prompt leaves (Anthropic's
        ``max_tokens`` is a ceiling); a prompt that fills the context is refused in Anthropic's
        words (``prompt is too long: N tokens > M maximum``, the 400 Claude Code compacts on)."""
        try:
            return await self.chat.create(chat_req, max_tokens_ceiling=True, priority=priority, **kw)
        except PromptTooLong as exc:
            raise invalid_request(f"prompt is too long: {exc.n_prompt} tokens > {exc.context_length - 1} maximum"
                                  ) from exc

    async def create(self, req: MessagesRequest, priority: int = INTERACTIVE_PRIORITY,
                     encoded: bool = False) -> Message | AsyncIterator[MessageStreamEvent | dict]:
        chat_req = self._chat_request(req)
        show_thinking = thinking_mode(req) != "disabled"
        if not req.stream:
            completion = await self._chat(chat_req, priority)
            choice = completion.choices[0]
            reply = choice.message
            content = [{"type": "thinking", "thinking": reply.reasoning_content, "signature": ""}] \
                if reply.reasoning_content and show_thinking else []
            if reply.content:
                content.append({"type": "text", "text": reply.content})
            content += [{"type": "tool_use", "id": _id("toolu"), "name": c.function.name,
                         "input": _input(c.function.arguments)} for c in reply.tool_calls or []]
            stop_reason, stop_sequence = _stop(choice.finish_reason, choice.stop_reason)
            return Message(id=_id("msg"), model=req.model, content=content, stop_reason=stop_reason,
                           stop_sequence=stop_sequence, usage=_usage(completion.usage))
        stream_req = chat_req.model_copy(update={"stream": True, "stream_options": StreamOptions(include_usage=True)})
        chunks = await self._chat(stream_req, priority, text_form="delta")
        return ChunkStream(self._events(req.model, chunks, show_thinking, encoded), chunks)

    @staticmethod
    async def _events(model: str, chunks: ChunkStream, show_thinking: bool,
                      encoded: bool = False) -> AsyncIterator[MessageStreamEvent | dict]:
        """Anthropic's events for ``chunks`` (chunks and ``TextDelta``s): one state machine
        opens and closes blocks, so a block is closed before the next one opens.
        ``show_thinking``: reasoning deltas become a ``thinking`` block (else they are dropped);
        ``encoded``: see the module docstring."""
        index = -1
        open_kind: str | None = None
        walk = ChunkWalk()
        template: FilledJSON | None = None  # the open block's content_block_delta, encoded

        def event(kind: str, **fields: Any) -> MessageStreamEvent:
            return MessageStreamEvent(type=kind, **fields)

        def close() -> list[MessageStreamEvent]:
            nonlocal open_kind
            if open_kind is None:
                return []
            open_kind = None
            return [event("content_block_stop", index=index)]

        def open_(kind: str, block: dict) -> list[MessageStreamEvent]:
            nonlocal index, open_kind, template
            out = close()
            index, open_kind, template = index + 1, kind, None
            return out + [event("content_block_start", index=index, content_block=block)]

        def delta(kind: str, block: dict, fields: dict) -> list[MessageStreamEvent]:
            out = open_(kind, block) if open_kind != kind else []
            return out + [event("content_block_delta", index=index, delta=fields)]

        def piece(p: TextDelta) -> list[MessageStreamEvent | dict]:
            """The events of a piece of text (of a tool call's arguments: only while its block is open)."""
            nonlocal template
            kind, block, delta_type, field = _BLOCKS[p.kind]
            if kind == "thinking" and not show_thinking or kind == "tool_use" and open_kind != kind:
                return []
            if not encoded or open_kind != kind:
                return delta(kind, block, {"type": delta_type, field: p.text})
            if template is None:
                template = FilledJSON(
                    event("content_block_delta", index=index, delta={"type": delta_type, field: MARK}))
            return [{"event": "content_block_delta", "data": template.fill(p.text)}]

        start = Message(id=_id("msg"), model=model, usage=Usage(input_tokens=chunks.prompt_tokens, output_tokens=0))
        yield event("message_start", message=start.model_dump())
        yield event("ping")
        async for chunk in chunks:
            if type(chunk) is TextDelta:  # the usual token
                for e in piece(chunk):
                    yield e
                continue
            if isinstance(chunk, ErrorResponse):
                for e in close():
                    yield e
                yield event("error", error={"type": stream_error_type(chunk.error), "message": chunk.error.message})
                return
            assert isinstance(chunk, ChatCompletionChunk)
            for p in walk.pieces(chunk):
                if type(p) is TextDelta:
                    events = piece(p)
                else:  # a tool call's head
                    events = open_("tool_use", {"type": "tool_use", "id": _id("toolu"), "name": p.name, "input": {}})
                for e in events:
                    yield e
        for e in close():
            yield e
        stop_reason, stop_sequence = _stop(walk.finish_reason, walk.stop_reason)
        yield event("message_delta", delta={"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                    usage=_usage(walk.usage).model_dump())
        yield event("message_stop")
