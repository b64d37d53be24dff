"""Anthropic's Messages renderer of the reply stream (``serving/generation/reply.py``): the whole
``Message`` (``message``) or its stream events (``MessageEvents``).

Reply: ``thinking`` (the model's reasoning, where thinking is shown), ``text`` and ``tool_use``
blocks (a call's id is ``toolu_`` and the reply's call id); ``stop_reason`` ``tool_use`` /
``max_tokens`` / ``stop_sequence`` (with ``stop_sequence`` set) / ``end_turn``. Usage in
Anthropic's terms: ``input_tokens`` are the prompt tokens not read from the prefix cache,
``cache_read_input_tokens`` those that were (their sum is ``count_tokens``' ``input_tokens``).

Stream (Anthropic's "Streaming messages"): ``message_start``, ``ping``, then per block
``content_block_start`` / ``content_block_delta`` (``thinking_delta``, ``text_delta``,
``input_json_delta``) / ``content_block_stop`` (one block at a time, never interleaved:
``BlockWriter``), then ``message_delta`` (stop reason, final usage) and ``message_stop``; a
failure after the start is an ``error`` event. For a caller that only sends the events
(``encoded``, the route), a ``content_block_delta`` of a block already open comes encoded:
``{"event", "data"}`` with its JSON written from the block's template (``FilledJSON``), the
event object's JSON.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from glmserve.protocol.anthropic import Message, MessageStreamEvent, Usage, stream_error_type
from glmserve.protocol.errors import APIError
from glmserve.serving.generation.blocks import BlockWriter
from glmserve.serving.generation.chunks import MARK, FilledJSON
from glmserve.serving.generation.reply import CallStart, Finish, Reply, TextDelta, Tokens, Whole, prefill_report

# a block kind -> its type, its empty start, and its delta's type and field
_BLOCKS = {"content": ("text", {"type": "text", "text": ""}, "text_delta", "text"),
           "reasoning": ("thinking", {"type": "thinking", "thinking": "", "signature": ""}, "thinking_delta",
                         "thinking"),
           "arguments": ("tool_use", None, "input_json_delta", "partial_json")}


def message_id() -> str:
    return f"msg_{uuid.uuid4().hex[:24]}"


def usage(tokens: Tokens) -> Usage:
    return Usage(input_tokens=tokens.prompt - tokens.cached, cache_read_input_tokens=tokens.cached,
                 output_tokens=tokens.completion, prefill_start=prefill_report(tokens.prefill))


def stop(finish: Finish) -> tuple[str, str | None]:
    """``(stop_reason, stop_sequence)`` of ``finish``."""
    if finish.calls and finish.reason == "stop":
        return "tool_use", None
    if finish.reason == "length":
        return "max_tokens", None
    return ("stop_sequence", finish.stop_string) if finish.stop_string is not None else ("end_turn", None)


def _input(arguments: str) -> dict:
    """A tool call's arguments (JSON text) as a ``tool_use`` block's ``input`` object (the
    parsers give JSON objects; anything else is kept under ``arguments``)."""
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        return {"arguments": arguments}
    return value if isinstance(value, dict) else {"arguments": value}


def message(whole: Whole, model: str, show_thinking: bool) -> Message:
    """The ``Message`` of ``whole``, for the requested ``model``; ``show_thinking``: reasoning
    becomes a ``thinking`` block (else it is left out)."""
    choice = whole.choices[0]
    content: list[dict[str, Any]] = [{"type": "thinking", "thinking": choice.reasoning, "signature": ""}] \
        if choice.reasoning and show_thinking else []
    if choice.content:
        content.append({"type": "text", "text": choice.content})
    content += [{"type": "tool_use", "id": f"toolu_{c.call_id}", "name": c.name, "input": _input(c.arguments)}
                for c in choice.calls]
    stop_reason, stop_sequence = stop(choice.finish)
    return Message(id=message_id(), model=model, content=content, stop_reason=stop_reason,
                   stop_sequence=stop_sequence, usage=usage(whole.tokens))


class MessageEvents(BlockWriter):
    """Anthropic's stream events of a reply (``events()``): ``MessageStreamEvent``s, with
    ``encoded`` some as ``{"event", "data"}`` (see the module docstring)."""

    def __init__(self, reply: Reply, model: str, show_thinking: bool, encoded: bool) -> None:
        super().__init__(reply)
        self.model, self.encoded = model, encoded
        self.hidden = frozenset() if show_thinking else frozenset({"reasoning"})
        self.index = -1
        self.template: FilledJSON | None = None  # the open block's content_block_delta, encoded

    def start(self) -> list[Any]:
        start = Message(id=message_id(), model=self.model,
                        usage=Usage(input_tokens=self.reply.prompt_tokens, output_tokens=0))
        return [MessageStreamEvent(type="message_start", message=start.model_dump()),
                MessageStreamEvent(type="ping")]

    def opened(self, kind: str, call: CallStart | None) -> list[Any]:
        self.index, self.template = self.index + 1, None
        block = {"type": "tool_use", "id": f"toolu_{call.call_id}", "name": call.name, "input": {}} \
            if call is not None else _BLOCKS[kind][1]
        return [MessageStreamEvent(type="content_block_start", index=self.index, content_block=block)]

    def delta(self, piece: TextDelta, first: bool) -> Any:
        _, _, delta_type, field = _BLOCKS[piece.kind]
        if not self.encoded or first:
            return MessageStreamEvent(type="content_block_delta", index=self.index,
                                      delta={"type": delta_type, field: piece.text})
        if self.template is None:
            self.template = FilledJSON(MessageStreamEvent(type="content_block_delta", index=self.index,
                                                          delta={"type": delta_type, field: MARK}))
        return {"event": "content_block_delta", "data": self.template.fill(piece.text)}

    def closed(self, kind: str, last: bool) -> list[Any]:
        return [MessageStreamEvent(type="content_block_stop", index=self.index)]

    def end(self) -> list[Any]:
        stop_reason, stop_sequence = stop(self.finish)
        return [MessageStreamEvent(type="message_delta", delta={"stop_reason": stop_reason,
                                                                "stop_sequence": stop_sequence},
                                   usage=usage(self.tokens).model_dump()),
                MessageStreamEvent(type="message_stop")]

    def error(self, exc: APIError) -> Any:
        error = exc.body().error
        return MessageStreamEvent(type="error", error={"type": stream_error_type(error), "message": error.message})
