"""The chat-completions handler: OpenAI request -> engine request -> OpenAI response or chunks.

Used by every engine and every front end (HTTP routes, later the in-process API). Stop strings
are applied here, once, for every engine (``serving/stop.py``).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass

from glmserve.chat import ChatTemplate
from glmserve.engine.base import Engine, EngineOverloaded
from glmserve.engine.types import GenerationOutput, GenerationRequest
from glmserve.protocol.chat import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatMessage,
    Choice,
    ChunkChoice,
    DeltaMessage,
    PromptTokensDetails,
    Usage,
)
from glmserve.protocol.errors import APIError, model_not_found, overloaded, server_error
from glmserve.serving.prompt import build_prompt, end_of_turn_token_ids
from glmserve.serving.sampling import check_supported, requested_max_tokens, stop_strings, to_sampling_params
from glmserve.serving.stop import StopStringMatcher

STREAM_DONE = "[DONE]"


@dataclass(slots=True)
class _Run:
    """One admitted request and what it has produced so far."""

    id: str
    created: int
    request: GenerationRequest
    stops: list[str]
    outputs: AsyncIterator[GenerationOutput]
    completion_tokens: int = 0
    cached_tokens: int = 0

    def usage(self) -> Usage:
        n_prompt = len(self.request.prompt_token_ids)
        return Usage(
            prompt_tokens=n_prompt,
            completion_tokens=self.completion_tokens,
            total_tokens=n_prompt + self.completion_tokens,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=self.cached_tokens),
        )


class ChatService:
    """Serve ``/v1/chat/completions`` for one model on one engine.

    ``create(req)`` returns a ``ChatCompletion`` or, for ``stream=True``, an async iterator of
    SSE ``data`` payloads (JSON chunk strings, then ``"[DONE]"``). Client errors raise
    ``APIError`` before anything is generated.
    """

    def __init__(self, engine: Engine, served_model_name: str, template: ChatTemplate) -> None:
        self.engine = engine
        self.model_name = served_model_name
        self.template = template
        self.context_length = engine.model_info.context_length
        self.stop_token_ids = end_of_turn_token_ids(template, engine.tokenizer)

    async def create(self, req: ChatCompletionRequest) -> ChatCompletion | AsyncIterator[str]:
        run = self._prepare(req)
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return self._stream(run, include_usage)
        return await self._complete(run)

    def _prepare(self, req: ChatCompletionRequest) -> _Run:
        if req.model != self.model_name:
            raise model_not_found(req.model)
        check_supported(req)
        prompt = build_prompt(
            req, self.template, self.engine.tokenizer, self.context_length, requested_max_tokens(req)
        )
        request = GenerationRequest(
            request_id=f"chatcmpl-{uuid.uuid4().hex}",
            prompt_token_ids=prompt.token_ids,
            sampling=to_sampling_params(req, prompt.max_tokens, self.stop_token_ids),
        )
        try:
            outputs = self.engine.generate(request)  # admission: may refuse at once
        except EngineOverloaded as exc:
            raise overloaded(str(exc), exc.retry_after_s) from exc
        return _Run(request.request_id, int(time.time()), request, stop_strings(req), outputs)

    async def _deltas(self, run: _Run) -> AsyncIterator[tuple[str, str | None]]:
        """``(text, finish_reason)`` pairs; the last has ``finish_reason`` set.

        Raises ``APIError`` (500) when the engine fails this request. Leaving early (client
        gone) closes the engine stream, which aborts the request."""
        matcher = StopStringMatcher(run.stops)
        try:
            async with aclosing(run.outputs) as outputs:
                async for out in outputs:
                    run.completion_tokens += len(out.token_ids)
                    run.cached_tokens = out.num_cached_tokens
                    if out.finish_reason == "error":
                        raise server_error(f"generation failed: {out.error}")
                    text, stopped = matcher.feed(out.text)
                    if stopped:
                        yield text, "stop"
                        return
                    if out.finished:
                        yield text + matcher.flush(), "length" if out.finish_reason == "length" else "stop"
                        return
                    if text:
                        yield text, None
        except APIError:
            raise
        except Exception as exc:  # an engine bug must end this request only
            raise server_error(f"generation failed: {type(exc).__name__}: {exc}") from exc

    async def _complete(self, run: _Run) -> ChatCompletion:
        parts: list[str] = []
        finish_reason: str | None = None
        async for text, finish_reason in self._deltas(run):
            parts.append(text)
        return ChatCompletion(
            id=run.id,
            created=run.created,
            model=self.model_name,
            choices=[Choice(message=ChatMessage(content="".join(parts)), finish_reason=finish_reason)],
            usage=run.usage(),
        )

    def _chunk(self, run: _Run, delta: DeltaMessage, finish_reason: str | None = None) -> str:
        chunk = ChatCompletionChunk(
            id=run.id,
            created=run.created,
            model=self.model_name,
            choices=[ChunkChoice(delta=delta, finish_reason=finish_reason)],
        )
        return chunk.model_dump_json(exclude_none=True)

    async def _stream(self, run: _Run, include_usage: bool) -> AsyncIterator[str]:
        yield self._chunk(run, DeltaMessage(role="assistant", content=""))
        try:
            async for text, finish_reason in self._deltas(run):
                if text:
                    yield self._chunk(run, DeltaMessage(content=text))
                if finish_reason is not None:
                    yield self._chunk(run, DeltaMessage(), finish_reason)
        except APIError as exc:
            yield exc.body().model_dump_json()
            return
        if include_usage:
            usage_chunk = ChatCompletionChunk(
                id=run.id, created=run.created, model=self.model_name, choices=[], usage=run.usage()
            )
            yield usage_chunk.model_dump_json(exclude_none=True)
        yield STREAM_DONE
