"""``/v1/embeddings`` bodies, in OpenAI's shapes (``openai.types.EmbeddingCreateParams``,
``CreateEmbeddingResponse``): ``input`` is a string, a list of strings, a list of token ids or
a list of lists of token ids; ``encoding_format`` ``float`` (a list of numbers) or ``base64``
(the little-endian float32 bytes, which the ``openai`` SDK asks for by default)."""

from __future__ import annotations

from typing import Literal, Union

from pydantic import BaseModel, StrictInt, StrictStr

from glmserve.protocol.chat import KeepAlive, _Lenient

EmbeddingInput = Union[StrictStr, list[StrictStr], list[StrictInt], list[list[StrictInt]]]


class EmbeddingRequest(_Lenient):
    model: str
    keep_alive: KeepAlive = None
    input: EmbeddingInput
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: StrictInt | None = None
    user: str | None = None


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str  # str: base64


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage
