"""``/v1/completions`` (legacy text completions) request and response bodies, after OpenAI's
API reference (``CreateCompletionRequest``, ``Completion``) with vLLM's sampling extensions."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field

from glmserve.protocol.chat import KeepsNull, SamplingRequest, Usage

MAX_PROMPTS = 128  # prompts in one request (each is one engine request)

TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]


class CompletionRequest(SamplingRequest):
    prompt: str | Annotated[list[str], Field(min_length=1, max_length=MAX_PROMPTS)] | TokenIds | \
        Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_PROMPTS)]
    max_tokens: int | None = Field(16, ge=1)  # OpenAI's default; null: what the context leaves
    best_of: int | None = Field(None, ge=1, le=128)
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=20)
    suffix: str | None = None


class CompletionLogprobs(BaseModel):
    """The legacy shape: per token its text, log-probability, the ``logprobs`` most likely
    tokens as {text: log-probability}, and where it starts in the choice's text."""

    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float] = Field(default_factory=list)
    top_logprobs: list[dict[str, float]] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(KeepsNull):
    """One prompt's text; ``logprobs`` and ``finish_reason`` are ``null`` until set, as OpenAI
    writes them."""

    KEEP_NULL = ("logprobs", "finish_reason")
    index: int = 0
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: Literal["stop", "length"] | None = None


class Completion(BaseModel):
    """A whole completion; a stream sends the same object per chunk, ``choices`` holding the
    new text of one prompt (by ``index``), and ``usage`` last when asked for."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
