"""The chat-completions handler: OpenAI request -> engine request -> OpenAI response or chunks.

Used by every engine and every front end (HTTP routes, later the in-process API). Stop strings
are applied here, once, for every engine (``serving/generation/stop.py``).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from glmserve.chat import ChatTemplate, image_urls
from glmserve.engine.base import Engine, EngineOverloaded, GrammarError
from glmserve.engine.types import GenerationOutput, GenerationRequest, TokenLogprob
from glmserve.multimodal import ImageError, MediaPolicy, load_images
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
from glmserve.protocol.errors import APIError, invalid_request, model_not_found, overloaded, server_error
from glmserve.serving.generation.request_scope import CACHE_SALT, REQUEST_PRIORITY
from glmserve.serving.adapters import AdapterTable
from glmserve.serving.generation.chunks import ChunkStream, StreamItem
from glmserve.serving.generation.run import Run, usage
from glmserve.serving.generation.prompt import build_prompt, end_of_turn_token_ids, special_token_id
from glmserve.serving.generation.merge import merged
from glmserve.serving.generation.metrics import ServingMetrics
from glmserve.serving.structured.schema_check import SchemaLimits
from glmserve.serving.generation.template_vars import template_kwargs
from glmserve.serving.generation.tools import plan_tools
from glmserve.serving.generation.reasoning_budget import budgeted
from glmserve.toolcalls import PARSERS, DeltaEvent, assemble, has_reasoning, output_parser, prompt_state, tag_texts
from glmserve.toolcalls.reasoning import THINK_END
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
from glmserve.serving.generation.stop import StopStringMatcher



class ChatService:
    """Serve ``/v1/chat/completions`` for one model on one engine.

    ``create(req)`` returns a ``ChatCompletion`` or, for ``stream=True``, an async iterator of
    ``ChatCompletionChunk``s; a failure after the stream began ends it with an ``ErrorResponse``
    (the HTTP layer serializes them and adds SSE's ``[DONE]``). Client errors raise ``APIError``
    before anything is generated.
    """

    def __init__(self, engine: Engine, served_model_name: str, template: ChatTemplate,
                 tool_parser: str | None = None, media_policy: MediaPolicy | None = None,
                 schema_limits: SchemaLimits | None = None, max_n: int = 1,
                 default_template_kwargs: dict[str, Any] | None = None,
                 generation_defaults: dict[str, float] | None = None, aliases: tuple[str, ...] = (),
                 reasoning_budget: int | None = None) -> None:
        """``tool_parser``: the model's tool-call format (a ``toolcalls.PARSERS`` name) or None;
        ``media_policy``: how ``image_url`` parts may be fetched (default: ``MediaPolicy()``);
        ``schema_limits``: bounds on client JSON schemas (default: ``SchemaLimits()``);
        ``max_n``: the largest ``n`` a request may ask for; ``default_template_kwargs``: chat
        template variables every request gets unless it sets them (``--default-chat-template-kwargs``);
        ``generation_defaults``: sampling fields for requests that leave them out
        (``--override-generation-config``); ``aliases``: other names of the base model (a
        ``--config`` entry's); ``reasoning_budget``: reasoning tokens before the reasoning is
        ended, for requests that set none (``--reasoning-budget``; None: no limit). Raises
        ``ValueError`` for a budget on a template that does not write ``<think>``.
        Requests pick the base model by ``served_model_name`` or an alias, or a LoRA adapter by
        its name."""
        self.engine = engine
        self.model_name = served_model_name
        self.aliases = frozenset(aliases)
        self.adapter_table = AdapterTable()  # start_runtime gives the one that outlives this engine
        self.adapter_table.attach(engine)
        self.media_policy = media_policy or MediaPolicy()
        self.schema_limits = schema_limits or SchemaLimits()
        self.template = template
        self.tool_parser = tool_parser
        self.max_n = max_n
        self.default_template_kwargs = dict(default_template_kwargs or {})
        self.generation_defaults = dict(generation_defaults or {})
        self.context_length = engine.model_info.context_length
        stop_ids = list(end_of_turn_token_ids(template, engine.tokenizer))
        for marker in PARSERS[tool_parser].end_of_turn if tool_parser else ():
            token_id = special_token_id(engine.tokenizer, marker)
            if token_id is not None and token_id not in stop_ids:
                stop_ids.append(token_id)
        self.stop_token_ids = tuple(stop_ids)
        self.reasoning = has_reasoning(template.source)  # replies are split into reasoning and answer
        # the parsers' tags that the vocabulary holds as special tokens: the engine writes their text
        tags = (special_token_id(engine.tokenizer, tag) for tag in tag_texts(tool_parser, self.reasoning))
        self.shown_special_ids = frozenset(i for i in tags if i is not None)
        if reasoning_budget is not None and not self.reasoning:
            raise ValueError("--reasoning-budget needs a chat template that writes <think> reasoning; this "
                             "model's does not")
        self.reasoning_budget = reasoning_budget
        self.end_of_reasoning_ids = engine.tokenizer.encode(THINK_END) if self.reasoning else []
        self.metrics = ServingMetrics(engine, served_model_name)

    async def create(self, req: ChatCompletionRequest, *,
                     max_tokens_ceiling: bool = False) -> ChatCompletion | AsyncIterator[StreamItem]:
        """``max_tokens_ceiling``: a ``max_tokens`` larger than what the prompt leaves of the
        context is lowered to fit (Anthropic clients send one ceiling whatever the model)
        instead of refused with a 400."""
        self.check_model(req.model)
        req, default_ceiling = with_defaults(req, self.generation_defaults)
        max_tokens_ceiling = max_tokens_ceiling or default_ceiling
        check_supported(req)  # before any image is fetched
        check_n(req.n, self.max_n)
        bias = logit_bias(req, self.engine.tokenizer.n_vocab)
        images = await self._load_images(req)
        # rendering and tokenizing a long prompt takes a while: not on the event loop
        runs = await asyncio.to_thread(self._prepare, req, images, bias, max_tokens_ceiling)
        # admission compiles the request's grammar (up to ~0.1 s at the limits): not on the event loop
        await self.admit_all(runs, "response_format" if req.response_format else "tools")
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return ChunkStream(self._stream(runs, include_usage), *(run.outputs for run in runs),
                               prompt_tokens=len(runs[0].request.prompt_token_ids))
        return await self._complete(runs)

    @property
    def adapters(self) -> tuple[str, ...]:
        """The LoRA adapters requests may name (``--lora``, and those loaded at run time; each
        is loaded in the engine when a request holds it: ``serving/adapters.py``)."""
        return self.adapter_table.names

    def check_model(self, model: str) -> None:
        """Raises ``APIError`` 404 unless ``model`` is the served model, an alias of it or one
        of its adapters."""
        if model != self.model_name and model not in self.aliases and model not in self.adapters:
            raise model_not_found(model)

    async def _load_images(self, req: ChatCompletionRequest) -> list:
        """The request's images, fetched and decoded under the media policy, in order. Raises
        ``APIError`` 400 (naming the part) for a model without vision or an image refused."""
        urls = image_urls(req.messages)
        if not urls:
            return []
        if not self.engine.model_info.vision:
            raise invalid_request("this model does not accept image input", urls[0][0])
        try:
            return await load_images([url for _, url in urls], self.media_policy)
        except ImageError as exc:
            raise invalid_request(f"image_url: {exc}", urls[exc.index or 0][0]) from exc

    def prompt_token_ids(self, req: ChatCompletionRequest) -> list[int]:
        """The prompt ``req`` would be given (template, tools), whatever its length, without
        images. Raises ``APIError`` 400 as ``create`` would for the messages and tools."""
        plan = plan_tools(req, self.tool_parser, self.engine.model_info.grammar, self.schema_limits)
        return build_prompt(req, self.template, self.engine.tokenizer, self.context_length, None, plan=plan,
                            tool_format=self.tool_parser, check_fit=False,
                            template_kwargs=template_kwargs(req, self.default_template_kwargs)).token_ids

    def _prepare(self, req: ChatCompletionRequest, images: list, bias: dict[int, float] | None,
                 max_tokens_ceiling: bool = False) -> list[Run]:
        """The request's ``n`` runs, sharing one prompt (the engines' prefix caches share its KV)."""
        plan = plan_tools(req, self.tool_parser, self.engine.model_info.grammar, self.schema_limits)
        prompt = build_prompt(
            req, self.template, self.engine.tokenizer, self.context_length, requested_max_tokens(req),
            plan=plan, tool_format=self.tool_parser, images=images,
            processor=self.engine.multimodal if self.engine.model_info.vision else None,
            template_kwargs=template_kwargs(req, self.default_template_kwargs),
            max_tokens_ceiling=max_tokens_ceiling,
        )
        parse_calls = self.tool_parser and (plan.offered or PARSERS[self.tool_parser].always_active)
        calls = self.tool_parser if parse_calls else None
        sampling = to_sampling_params(req, prompt.max_tokens, self.stop_token_ids, plan.grammar, bias)
        budget = self._reasoning_budget(req, plan.grammar)
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        runs = []
        for i in range(req.n):
            request = GenerationRequest(
                request_id=rid if req.n == 1 else f"{rid}-{i}",
                prompt_token_ids=prompt.token_ids,
                sampling=choice_sampling(sampling, i),
                lora=req.model if req.model in self.adapters else None,
                multimodal=prompt.multimodal,
                priority=REQUEST_PRIORITY.get(),
                shown_special_ids=self.shown_special_ids,
                cache_salt=CACHE_SALT.get(),
            )
            runs.append(Run(rid, created, request, stop_strings(req), None,
                            output_parser(calls, plan.functions, self.reasoning, prompt.text),
                            plan.forced_prefix, plan.max_calls, req.model, index=i,
                            reasoning_budget=None if budget is None else (budget, prompt_state(prompt.text))))
        return runs

    def _reasoning_budget(self, req: ChatCompletionRequest, grammar: str | None) -> int | None:
        """The reasoning budget for ``req`` (its own ``thinking_token_budget``, else the server's),
        None where there is none or nothing to end: a template without reasoning, or a reply
        constrained by a grammar from its first token."""
        budget = req.thinking_token_budget if req.thinking_token_budget is not None else self.reasoning_budget
        return None if budget is None or not self.reasoning or grammar else budget

    async def admit_all(self, runs: list[Run], grammar_param: str | None = None) -> None:
        """Admit every run (off the event loop), or none: when one is refused, the runs
        already admitted are aborted and its ``APIError`` is raised."""
        loop = asyncio.get_running_loop()
        admitted = []
        try:
            for run in runs:
                run.outputs = await asyncio.to_thread(self.admit, run.model, run.request, loop, grammar_param)
                admitted.append(run)
        except BaseException:
            for run in admitted:
                await run.outputs.aclose()
            raise

    def admit(self, model: str, request: GenerationRequest, loop: asyncio.AbstractEventLoop,
              grammar_param: str | None = None) -> AsyncIterator[GenerationOutput]:
        """Hand ``request`` (for the requested ``model``) to the engine, from any thread;
        ``loop`` consumes the stream. Raises ``APIError`` 429 when the engine is full, 400
        naming ``grammar_param`` when the request's grammar does not compile."""
        try:
            return self.engine.generate(request, loop)
        except EngineOverloaded as exc:
            self.metrics.rejected.labels(model).inc()
            raise overloaded(str(exc), exc.retry_after_s) from exc
        except GrammarError as exc:
            raise invalid_request(str(exc), grammar_param) from exc

    async def deltas(self, run: Run) -> AsyncIterator[tuple[str, str | None, list[TokenLogprob]]]:
        """``(text, finish_reason, logprobs)``; the last has ``finish_reason`` set. ``logprobs``
        (when the request asked for them) are those of the tokens since the previous item: a
        token whose text is held back (a possible stop string) gives its logprobs with the
        text that follows.

        Raises ``APIError`` (500) when the engine fails this request. Leaving early (client
        gone) closes the engine stream, which aborts the request."""
        matcher = StopStringMatcher(run.stops)
        pending: list[TokenLogprob] = []
        reason = "abort"  # unless the loop below ends otherwise (the client left)
        stream = run.outputs
        if run.reasoning_budget is not None:
            loop = asyncio.get_running_loop()
            stream = budgeted(stream, run.request, *run.reasoning_budget, self.end_of_reasoning_ids,
                              self.engine.tokenizer.decode,
                              lambda follow: asyncio.to_thread(self.admit, run.model, follow, loop))
        try:
            async with aclosing(stream) as outputs:
                async for out in outputs:
                    if out.token_ids and run.first_token_at is None:
                        run.first_token_at = time.perf_counter()
                    run.completion_tokens += len(out.token_ids)
                    run.cached_tokens = out.num_cached_tokens
                    run.engine_prompt_tokens = out.num_prompt_tokens or run.engine_prompt_tokens
                    if out.logprobs:
                        pending += out.logprobs
                    if out.finish_reason == "error":
                        reason = "error"
                        if out.invalid:
                            raise invalid_request(f"the engine refused the request: {out.error}")
                        raise server_error(f"generation failed: {out.error}")
                    text, stopped = matcher.feed(out.text)
                    if stopped:
                        reason, run.stop_reason = "stop", matcher.matched
                        yield text, "stop", pending
                        return
                    if out.finished:
                        reason = "length" if out.finish_reason == "length" else out.finish_reason or "stop"
                        yield text + matcher.flush(), "length" if out.finish_reason == "length" else "stop", pending
                        return
                    if text:
                        yield text, None, pending
                        pending = []
        except APIError:
            raise
        except Exception as exc:  # an engine bug must end this request only
            reason = "error"
            raise server_error(f"generation failed: {type(exc).__name__}: {exc}") from exc
        finally:
            self.metrics.finished(run.model, reason, run.prompt_tokens, run.cached_tokens,
                                  run.completion_tokens, run.arrival, run.first_token_at, time.perf_counter())

    async def _events(self, run: Run) -> AsyncIterator[tuple[list[DeltaEvent], str | None, list[TokenLogprob]]]:
        """Parsed output: ``(events, finish_reason, logprobs)``; without a tool parser every
        text delta is one content event. ``finish_reason`` is ``tool_calls`` when the reply made
        calls."""
        parser, made_calls = run.parser, False
        if parser and run.forced_prefix:
            parser.feed(run.forced_prefix)  # the name line the prompt already holds
        async for text, finish, logprobs in self.deltas(run):
            if parser is None:
                events = [DeltaEvent("content", text)] if text else []
            else:
                events = parser.feed(text) + (parser.finish(truncated=finish == "length") if finish else [])
                if run.max_calls is not None:
                    events = [e for e in events if e.kind != "tool_call" or e.index < run.max_calls]
            made_calls = made_calls or any(e.kind == "tool_call" for e in events)
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
            return self.engine.tokenizer.decode([token_id])

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
        if event.kind == "content":
            return [self._chunk(run, DeltaMessage(content=event.text))]
        if event.kind == "reasoning":
            return [self._chunk(run, DeltaMessage(reasoning_content=event.text))]
        # a call as OpenAI streams one: id, type and name first, then the arguments in pieces
        chunks = []
        if event.name:
            head = DeltaToolCall(index=event.index, id=_call_id(), type="function",
                                 function=DeltaFunction(name=event.name, arguments=""))
            chunks.append(self._chunk(run, DeltaMessage(tool_calls=[head])))
        if event.arguments:
            body = DeltaToolCall(index=event.index, function=DeltaFunction(arguments=event.arguments))
            chunks.append(self._chunk(run, DeltaMessage(tool_calls=[body])))
        return chunks

    async def _stream(self, runs: list[Run], include_usage: bool) -> AsyncIterator[StreamItem]:
        for run in runs:
            yield self._chunk(run, DeltaMessage(role="assistant", content=""))
        carried: list[list[TokenLogprob]] = [[] for _ in runs]  # logprobs of tokens that made no chunk yet
        try:
            async with aclosing(merged([self._events(run) for run in runs])) as parsed:
                async for i, (events, finish_reason, logprobs) in parsed:
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
