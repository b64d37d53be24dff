"""``ChunkStream``: the stream a service's ``create`` returns for ``stream=True`` (chat,
completions, responses, messages), with the engine requests it must abort when closed;
``TextDelta``, the piece of text most tokens of a streamed chat reply make, for the APIs mapped
onto chat; and ``FilledJSON`` (``NumberedJSON``), a chunk's (an event's) JSON written from a
template, for a caller that only sends it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from json.encoder import encode_basestring
from typing import Literal, NamedTuple

from pydantic import BaseModel

from glmserve.engine.types import GenerationOutput
from glmserve.protocol.chat import ChatCompletionChunk
from glmserve.protocol.errors import ErrorResponse


class TextDelta(NamedTuple):
    """The next piece of one choice's reply, alone in its chunk (no finish reason, no logprobs):
    ``kind`` ``content`` or ``reasoning`` text, or ``arguments``, the next piece of the JSON
    arguments of tool call ``call`` (0-based within the reply), whose head came before in a
    chunk. ``text`` is never empty. What most tokens of a streamed reply make; the services
    mapped onto chat read it instead of a ``ChatCompletionChunk`` built for it
    (``ChatService.create(text_form="delta")``)."""

    kind: Literal["content", "reasoning", "arguments"]
    text: str
    call: int = 0
    choice: int = 0


class ToolCallHead(NamedTuple):
    """The head of tool call ``call`` (0-based within the reply): its ``call_id`` and ``name``;
    the pieces of its arguments follow as ``TextDelta("arguments", ...)``."""

    call_id: str
    name: str
    call: int = 0


class ChunkWalk:
    """The pieces of a streamed chat reply, one chunk at a time, in the order a client shows
    them: reasoning, then content, then each tool call's head and argument pieces; and, once the
    stream ends, its ``finish_reason``, ``stop_reason`` (the stop string matched) and ``usage``.
    What ``/v1/messages`` and ``/v1/responses`` turn into their own events (a ``TextDelta``
    that came alone needs no walk: it is its own piece)."""

    __slots__ = ("finish_reason", "stop_reason", "usage")

    def __init__(self) -> None:
        self.finish_reason: str | None = None
        self.stop_reason: str | None = None
        self.usage = None

    def pieces(self, chunk: ChatCompletionChunk) -> list[TextDelta | ToolCallHead]:
        """``chunk``'s pieces (its finish reason, stop string and usage kept)."""
        self.usage = chunk.usage or self.usage
        out: list[TextDelta | ToolCallHead] = []
        for choice in chunk.choices:
            delta = choice.delta
            self.finish_reason = choice.finish_reason or self.finish_reason
            self.stop_reason = choice.stop_reason or self.stop_reason
            if delta.reasoning_content:
                out.append(TextDelta("reasoning", delta.reasoning_content))
            if delta.content:
                out.append(TextDelta("content", delta.content))
            for call in delta.tool_calls or []:
                if call.id:  # a new call: its id and name come first
                    out.append(ToolCallHead(call.id, call.function.name or "", call.index))
                elif call.function and call.function.arguments:
                    out.append(TextDelta("arguments", call.function.arguments, call.index))
        return out


# a chunk, an error body, or, only where the caller asked for them (``ChatService.create``'s
# ``text_form``), a chunk of text alone as its JSON (``FilledJSON``) or as a ``TextDelta``
StreamItem = ChatCompletionChunk | ErrorResponse | TextDelta | str

MARK = "\x00glmserve-text\x00"  # stands for the text in a template; JSON writes it as one run of escapes


class FilledJSON:
    """``fill(text)``: ``template.model_dump_json(exclude_none=True)`` with ``text`` in place of
    the one string field that holds ``MARK``: the same JSON as dumping the model built with
    ``text`` there, in ~0.3 µs instead of the ~5 µs it takes to build and dump a chunk (3 nested
    pydantic models) for every token. The text is written as pydantic writes a string: JSON's
    escapes for ``"``, ``\\`` and control characters only (``json.encoder.encode_basestring``).
    Raises ``ValueError`` if ``MARK`` is not in exactly one place of the template's JSON."""

    __slots__ = ("_head", "_tail")

    def __init__(self, template: BaseModel) -> None:
        dumped = template.model_dump_json(exclude_none=True)
        parts = dumped.split(encode_basestring(MARK))
        if len(parts) != 2:
            raise ValueError(f"the template holds the mark {len(parts) - 1} times, not once")
        self._head, self._tail = parts

    def fill(self, text: str) -> str:
        return self._head + encode_basestring(text) + self._tail


class NumberedJSON:
    """``fill(number, text)``: as ``FilledJSON.fill``, for a template whose integer ``field``
    (before the text, 0 in the template) is numbered event by event (the Responses API's
    ``sequence_number``). Raises ``ValueError`` unless the mark is in one place and ``field``
    is 0 in one place before it."""

    __slots__ = ("_head", "_middle", "_tail")

    def __init__(self, template: BaseModel, field: str) -> None:
        filled = FilledJSON(template)
        key = f'"{field}":0'
        parts = filled._head.split(key)
        if len(parts) != 2:
            raise ValueError(f"{key} is {len(parts) - 1} times before the mark, not once")
        self._head, self._middle, self._tail = parts[0] + key[:-1], parts[1], filled._tail

    def fill(self, number: int, text: str) -> str:
        return f"{self._head}{number}{self._middle}{encode_basestring(text)}{self._tail}"


class ChunkStream:
    """The stream ``ChatService.create`` returns: iterates the chunk generator; ``aclose()``
    closes it and aborts the engine requests, also when iteration never began (closing a
    generator that never started runs none of its code). ``prompt_tokens``: the prompt's
    length, known before the first chunk (0 where not given)."""

    __slots__ = ("_chunks", "_outputs", "prompt_tokens")

    def __init__(self, chunks: AsyncIterator[StreamItem], *outputs: AsyncIterator[GenerationOutput],
                 prompt_tokens: int = 0) -> None:
        self._chunks, self._outputs, self.prompt_tokens = chunks, outputs, prompt_tokens

    def __aiter__(self) -> ChunkStream:
        return self

    def __anext__(self):
        return self._chunks.__anext__()

    async def aclose(self) -> None:
        try:
            await self._chunks.aclose()
        finally:
            for outputs in self._outputs:
                await outputs.aclose()
