"""The chat-completions handler: OpenAI request -> engine request -> OpenAI response or chunks,
over the model's shared pipeline (``serving/generation/pipeline.py``: admission, deltas, stop
strings, applied once for every engine). Used by every front end (HTTP routes, the in-process
``LLM``) and by the APIs mapped onto chat (messages, responses)."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any, Literal

from glmserve.engine.base import Engine
from glmserve.engine.rules import model_text
from glmserve.engine.types import INTERACTIVE_PRIORITY, GenerationRequest, TokenLogprob
from glmserve.protocol.chat import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatMessage,
    Choice,
    ChoiceLogprobs,
    ChunkChoice,
    DeltaFunction,
    DeltaMessage,
    DeltaToolCall,
    FunctionCall,
    TokenLogprobEntry,
    ToolCall,
    TopLogprob,
)
from glmserve.protocol.errors import APIError
from glmserve.serving.generation.chunks import MARK, ChunkStream, FilledJSON, StreamItem, TextDelta
from glmserve.serving.generation.merge import merged
from glmserve.serving.generation.pipeline import ModelPipeline
from glmserve.serving.generation.prompt import build_prompt
from glmserve.serving.generation.request_scope import CACHE_SALT
from glmserve.serving.generation.run import Run, usage
from glmserve.serving.generation.sampling import (
    check_n,
    check_supported,
    choice_sampling,
    logit_bias,
    requested_max_tokens,
    stop_strings,
    to_sampling_params,
    with_defaults,
)
from glmserve.serving.generation.template_vars import template_kwargs
from glmserve.serving.generation.tools import plan_tools
from glmserve.toolcalls import PARSERS, DeltaEvent, assemble, output_parser, prompt_state

log = logging.getLogger("glmserve.chat")


class ChatService:
    """Serve ``/v1/chat/completions`` for one model (``ModelPipeline``: its engine, names,
    template, defaults and the shared admit -> deltas pipeline).

    ``create(req)`` returns a ``ChatCompletion`` or, for ``stream=True``, an async iterator of
    ``ChatCompletionChunk``s; a failure after the stream began ends it with an ``ErrorResponse``
    (the HTTP layer serializes them and adds SSE's ``[DONE]``). Client errors raise ``APIError``
    before anything is generated.
    """

    def __init__(self, model: ModelPipeline | Engine, *args: Any, **kwargs: Any) -> None:
        """``model``: the served model, or the arguments of one (``ModelPipeline(engine,
        served_model_name, template, ...)``)."""
        self.model = model if isinstance(model, ModelPipeline) else ModelPipeline(model, *args, **kwargs)

    async def create(self, req: ChatCompletionRequest, *, max_tokens_ceiling: bool = False,
                     priority: int = INTERACTIVE_PRIORITY,
                     text_form: Literal["chunk", "json", "delta"] = "chunk",
                     ) -> ChatCompletion | AsyncIterator[StreamItem]:
        """``max_tokens_ceiling``: a ``max_tokens`` larger than what the prompt leaves of the
        context is lowered to fit (Anthropic clients send one ceiling whatever the model)
        instead of refused with a 400; ``priority``: the engine requests' (``GenerationRequest``;
        batch lines run at ``BATCH_PRIORITY``); ``text_form``: how a stream gives a chunk that
        holds one piece of text alone (a ``TextDelta``: content, reasoning or a tool call's next
        arguments; no finish reason, no logprobs): as the chunk (``chunk``), as its JSON
        (``json``: a ``str``, what ``model_dump_json(exclude_none=True)`` gives, for a caller
        that only sends it) or as the ``TextDelta`` (``delta``, for the APIs mapped onto chat)."""
        self.model.check_model(req.model)
        req, default_ceiling = with_defaults(req, self.model.generation_defaults)
        max_tokens_ceiling = max_tokens_ceiling or default_ceiling
        check_supported(req)  # before any image is fetched
        check_n(req.n, self.model.max_n)
        bias = logit_bias(req, self.model.engine.tokenizer.n_vocab)
        images = await self.model.load_images(req)
        # rendering and tokenizing a long prompt takes a while: not on the event loop
        runs = await asyncio.to_thread(self._prepare, req, images, bias, max_tokens_ceiling, priority)
        # admission compiles the request's grammar (up to ~0.1 s at the limits): not on the event loop
        await self.model.admit_all(runs, "response_format" if req.response_format else "tools")
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return ChunkStream(self._stream(runs, include_usage, text_form), *(run.outputs for run in runs),
                               prompt_tokens=len(runs[0].request.prompt_token_ids))
        return await self._complete(runs)

    def _prepare(self, req: ChatCompletionRequest, images: list, bias: dict[int, float] | None,
                 max_tokens_ceiling: bool, priority: int) -> list[Run]:
        """The request's ``n`` runs, sharing one prompt (the engines' prefix caches share its KV)."""
        plan = plan_tools(req, self.model.tool_parser, self.model.engine.model_info.grammar, self.model.schema_limits)
        prompt = build_prompt(
            req, self.model.template, self.model.engine.tokenizer, self.model.context_length, requested_max_tokens(req),
            plan=plan, tool_format=self.model.tool_parser, images=images,
            processor=self.model.engine.multimodal if self.model.engine.model_info.vision else None,
            template_kwargs=template_kwargs(req, self.model.default_template_kwargs),
            max_tokens_ceiling=max_tokens_ceiling,
        )
        parse_calls = self.model.tool_parser and (plan.offered or PARSERS[self.model.tool_parser].always_active)
        calls = self.model.tool_parser if parse_calls else None
        sampling = to_sampling_params(req, prompt.max_tokens, self.model.stop_token_ids, plan.grammar, bias)
        budget = self._reasoning_budget(req, plan.grammar)
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        runs = []
        for i in range(req.n):
            request = GenerationRequest(
                request_id=rid if req.n == 1 else f"{rid}-{i}",
                prompt_token_ids=prompt.token_ids,
                sampling=choice_sampling(sampling, i),
                lora=req.model if req.model in self.model.adapters else None,
                multimodal=prompt.multimodal,
                priority=priority,
                shown_special_ids=self.model.shown_special_ids,
                cache_salt=CACHE_SALT.get(),
            )
            runs.append(Run(rid, created, request, stop_strings(req), None,
                            output_parser(calls, plan.functions, self.model.reasoning, prompt.text),
                            plan.forced_prefix, plan.max_calls, req.model, index=i,
                            reasoning_budget=None if budget is None else (budget, prompt_state(prompt.text))))
        return runs

    def _reasoning_budget(self, req: ChatCompletionRequest, grammar: str | None) -> int | None:
        """The reasoning budget for ``req`` (its own ``thinking_token_budget``, else the server's),
        None where there is none or nothing to end: a template without reasoning, or a reply
        constrained by a grammar from its first token."""
        budget = req.thinking_token_budget if req.thinking_token_budget is not None else self.model.reasoning_budget
        return None if budget is None or not self.model.reasoning or grammar else budget

    async def _events(self, run: Run) -> AsyncIterator[tuple[list[DeltaEvent], str | None, list[TokenLogprob]]]:
        """Parsed output: ``(events, finish_reason, logprobs)``; without a tool parser every
        text delta is one content event. ``finish_reason`` is ``tool_calls`` when the reply made
        calls."""
        parser, made_calls = run.parser, False
        if parser and run.forced_prefix:
            parser.feed(run.forced_prefix)  # the name line the prompt already holds
        async for text, finish, logprobs in self.model.deltas(run):
            if parser is None:
                events = [DeltaEvent("content", text)] if text else []
            else:
                events = parser.feed(text) + (parser.finish(truncated=finish == "length") if finish else [])
                if run.max_calls is not None:
                    events = [e for e in events if e.kind != "tool_call" or e.index < run.max_calls]
            for e in events:  # tags' look-alikes, escaped by the engine, as the model wrote them
                e.text, e.name, e.arguments = (model_text(run.request, x) for x in (e.text, e.name, e.arguments))
            made_calls = made_calls or any(e.kind == "tool_call" for e in events)
            if finish and parser is not None and parser.unread:
                log.warning("%s: %d tool call(s) could not be read and came back as content: %s",
                            run.request.request_id, len(parser.unread), "; ".join(c[:200] for c in parser.unread))
            yield events, ("tool_calls" if made_calls and finish == "stop" else finish), logprobs

    async def _complete(self, runs: list[Run]) -> ChatCompletion:
        events: list[list[DeltaEvent]] = [[] for _ in runs]
        logprobs: list[list[TokenLogprob]] = [[] for _ in runs]
        finishes: list[str | None] = [None] * len(runs)
        async with aclosing(merged([self._events(run) for run in runs])) as parsed:
            async for i, (batch, finish, token_logprobs) in parsed:
                events[i] += batch
                logprobs[i] += token_logprobs
                finishes[i] = finish or finishes[i]
        choices = []
        for i, (batch, finish) in enumerate(zip(events, finishes)):
            out = assemble(batch)
            calls = [ToolCall(id=_call_id(), function=FunctionCall(name=c.name, arguments=c.arguments))
                     for c in out.tool_calls]
            message = ChatMessage(content=out.content, tool_calls=calls or None,
                                  reasoning_content=out.reasoning_content)
            choices.append(Choice(index=i, message=message, finish_reason=finish, stop_reason=runs[i].stop_reason,
                                  logprobs=self._logprobs(logprobs[i]) if runs[i].wants_logprobs else None))
        first = runs[0]
        return ChatCompletion(id=first.id, created=first.created, model=first.model, choices=choices,
                              usage=usage(runs))

    def _logprobs(self, logprobs: list[TokenLogprob]) -> ChoiceLogprobs:
        """OpenAI's ``logprobs.content`` for ``logprobs`` (token text from the tokenizer,
        ``bytes`` its UTF-8 encoding, as vLLM gives them)."""
        def text(token_id: int) -> str:
            return self.model.engine.tokenizer.decode([token_id])

        def entry(lp: TokenLogprob) -> TokenLogprobEntry:
            token = text(lp.token_id)
            return TokenLogprobEntry(token=token, logprob=lp.logprob, bytes=list(token.encode("utf-8")),
                                     top_logprobs=[TopLogprob(token=t, logprob=v, bytes=list(t.encode("utf-8")))
                                                   for t, v in ((text(tid), v) for tid, v in lp.top)])
        return ChoiceLogprobs(content=[entry(lp) for lp in logprobs])

    def _chunk(self, run: Run, delta: DeltaMessage, finish_reason: str | None = None) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=run.id,
            created=run.created,
            model=run.model,
            choices=[ChunkChoice(index=run.index, delta=delta, finish_reason=finish_reason,
                                 stop_reason=run.stop_reason if finish_reason else None)],
        )

    def _event_chunks(self, run: Run, event: DeltaEvent) -> list[ChatCompletionChunk]:
        if event.kind != "tool_call":
            return [self._chunk(run, _delta(event.kind, event.text))]
        # a call as OpenAI streams one: id, type and name first, then the arguments in pieces
        chunks = []
        if event.name:
            head = DeltaToolCall(index=event.index, id=_call_id(), type="function",
                                 function=DeltaFunction(name=event.name, arguments=""))
            chunks.append(self._chunk(run, DeltaMessage(tool_calls=[head])))
        if event.arguments:
            chunks.append(self._chunk(run, _delta("arguments", event.arguments, event.index)))
        return chunks

    def _piece_json(self, templates: dict[tuple[str, int], FilledJSON], run: Run, piece: TextDelta) -> str:
        """``piece``'s chunk in ``run`` as JSON, from the template for its kind and call, made
        on first use (``templates``: the run's)."""
        key = (piece.kind, piece.call)
        template = templates.get(key)
        if template is None:
            template = templates[key] = FilledJSON(self._chunk(run, _delta(piece.kind, MARK, piece.call)))
        return template.fill(piece.text)

    async def _stream(self, runs: list[Run], include_usage: bool,
                      text_form: Literal["chunk", "json", "delta"] = "chunk") -> AsyncIterator[StreamItem]:
        for run in runs:
            yield self._chunk(run, DeltaMessage(role="assistant", content=""))
        carried: list[list[TokenLogprob]] = [[] for _ in runs]  # logprobs of tokens that made no chunk yet
        # a piece of text alone skips the chunk's models (~5 µs per token) where the caller asked
        fast = [text_form != "chunk" and not run.wants_logprobs for run in runs]
        templates: list[dict[tuple[str, int], FilledJSON]] = [{} for _ in runs]
        try:
            async with aclosing(merged([self._events(run) for run in runs])) as parsed:
                async for i, (events, finish_reason, logprobs) in parsed:
                    if fast[i] and finish_reason is None and len(events) == 1:  # the usual token
                        piece = _piece(events[0], i)
                        if piece is not None:
                            yield piece if text_form == "delta" else self._piece_json(templates[i], runs[i], piece)
                            continue
                    chunks = [chunk for event in events for chunk in self._event_chunks(runs[i], event)]
                    if finish_reason is not None:
                        chunks.append(self._chunk(runs[i], DeltaMessage(), finish_reason))
                    carried[i] += logprobs
                    if chunks and runs[i].wants_logprobs:
                        chunks[0].choices[0].logprobs = self._logprobs(carried[i])
                        carried[i] = []
                    for chunk in chunks:
                        yield chunk
        except APIError as exc:
            yield exc.body()
            return
        if include_usage:
            first = runs[0]
            yield ChatCompletionChunk(id=first.id, created=first.created, model=first.model, choices=[],
                                      usage=usage(runs))


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _piece(event: DeltaEvent, choice: int = 0) -> TextDelta | None:
    """``event`` as a ``TextDelta``, if it is one: non-empty text, or a piece of a call's
    arguments after its head."""
    if event.kind == "tool_call":
        return TextDelta("arguments", event.arguments, event.index, choice) \
            if event.arguments and not event.name else None
    return TextDelta(event.kind, event.text, 0, choice) if event.text else None


def _delta(kind: str, text: str, call: int = 0) -> DeltaMessage:
    """The chunk delta of a ``TextDelta``'s ``kind``, ``text`` and ``call``."""
    if kind == "content":
        return DeltaMessage(content=text)
    if kind == "reasoning":
        return DeltaMessage(reasoning_content=text)
    return DeltaMessage(tool_calls=[DeltaToolCall(index=call, function=DeltaFunction(arguments=text))])
