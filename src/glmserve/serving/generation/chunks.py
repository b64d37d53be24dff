"""``ChunkStream``: the stream a service's ``create`` returns for ``stream=True`` (chat,
completions, responses, messages), with the engine requests it must abort when closed; and
``FilledJSON`` (``NumberedJSON``), a chunk's (an event's) JSON written from a template, for a
caller that only sends it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from json.encoder import encode_basestring

from pydantic import BaseModel

from glmserve.protocol.chat import ChatCompletionChunk
from glmserve.protocol.errors import ErrorResponse

# a chunk, an error body, or, where the caller asked for it (``ChatService.create(encoded=True)``),
# a chunk of text alone as its JSON (``FilledJSON``)
StreamItem = ChatCompletionChunk | ErrorResponse | str

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
    """A stream a service returns: iterates its generator of items; ``aclose()`` closes it and
    then ``outputs`` (engine streams, whose closing aborts their requests, or the stream it was
    rendered from), also when iteration never began (closing a generator that never started
    runs none of its code). ``prompt_tokens``: the prompt's length, known before the first item
    (0 where not given)."""

    __slots__ = ("_chunks", "_outputs", "prompt_tokens")

    def __init__(self, chunks: AsyncIterator, *outputs: AsyncIterator,
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
