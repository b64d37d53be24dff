"""``ChunkStream``: the stream a service's ``create`` returns for ``stream=True`` (chat,
completions, responses, messages), with the engine requests it must abort when closed."""

from __future__ import annotations

from collections.abc import AsyncIterator

from glmserve.engine.types import GenerationOutput
from glmserve.protocol.chat import ChatCompletionChunk
from glmserve.protocol.errors import ErrorResponse

StreamItem = ChatCompletionChunk | ErrorResponse


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
