"""The chat-completions handler: OpenAI request -> engine requests -> the reply stream
(``serving/generation/reply.py``), over the model's shared pipeline
(``serving/generation/pipeline.py``: admission, deltas, stop strings, applied once for every
engine); ``create`` renders it as chat completions (``serving/chat/render.py``). Used by every
front end (HTTP routes, the in-process ``LLM``); the APIs mapped onto chat (messages, responses)
render ``reply`` their own way."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing, nullcontext

from glmserve.chat import image_urls
from glmserve.engine.rules import model_text
from glmserve.engine.types import INTERACTIVE_PRIORITY, GenerationRequest
from glmserve.protocol.chat import ChatCompletion, ChatCompletionRequest
from glmserve.serving.chat.heal import healer_for
from glmserve.serving.chat.render import chunks, completion
from glmserve.serving.generation.chunks import ChunkStream, StreamItem
from glmserve.serving.generation.merge import merged
from glmserve.serving.generation.pipeline import ModelPipeline
from glmserve.serving.generation.prompt import build_prompt
from glmserve.serving.generation.reply import (
    CallStart,
    Done,
    Finish,
    Logprobs,
    Reply,
    ReplyEvent,
    TextDelta,
    call_id,
    collect,
)
from glmserve.serving.generation.request_scope import engine_scope
from glmserve.serving.generation.run import Run, tokens
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
from glmserve.serving.generation.template_vars import EFFORT_BUDGETS, template_kwargs
from glmserve.serving.generation.tools import plan_tools
from glmserve.toolcalls import PARSERS, output_parser, prompt_state

log = logging.getLogger("glmserve.chat")


class ChatService:
    """Serve ``/v1/chat/completions`` for one model (``ModelPipeline``: its engine, names,
    template, defaults and the shared admit -> deltas pipeline).

    ``create(req)`` returns a ``ChatCompletion`` or, for ``stream=True``, an async iterator of
    ``ChatCompletionChunk``s; a failure after the stream began ends it with an ``ErrorResponse``
    (the HTTP layer serializes them and adds SSE's ``[DONE]``). Client errors raise ``APIError``
    before anything is generated.
    """

    def __init__(self, pipeline: ModelPipeline) -> None:
        self.pipeline = pipeline

    async def create(self, req: ChatCompletionRequest, *, priority: int = INTERACTIVE_PRIORITY,
                     encoded: bool = False) -> ChatCompletion | AsyncIterator[StreamItem]:
        """The ``ChatCompletion``, or for ``stream`` its chunks (``serving/chat/render.py``;
        ``encoded``: pieces of text alone as their JSON, for a caller that only sends them).
        ``priority``: as ``reply``'s. Raises ``APIError`` before anything is generated."""
        reply = await self.reply(req, priority=priority)
        decode = self.pipeline.engine.tokenizer.decode
        if not req.stream:
            return completion(reply, await collect(reply), decode)
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return ChunkStream(chunks(reply, include_usage, decode, encoded), reply,
                           prompt_tokens=reply.prompt_tokens)

    async def reply(self, req: ChatCompletionRequest, *, max_tokens_ceiling: bool = False,
                    priority: int = INTERACTIVE_PRIORITY) -> Reply:
        """The reply stream of ``req`` (its ``stream`` field aside), admitted.
        ``max_tokens_ceiling``: a ``max_tokens`` larger than what the prompt leaves of the
        context is lowered to fit (Anthropic clients send one ceiling whatever the model)
        instead of refused with a 400; ``priority``: the engine requests' (``GenerationRequest``;
        batch lines run at ``BATCH_PRIORITY``). Raises ``APIError`` before anything is
        generated."""
        req, default_ceiling = with_defaults(req, self.pipeline.generation_defaults)
        max_tokens_ceiling = max_tokens_ceiling or default_ceiling
        check_supported(req)  # before any image is fetched
        check_n(req.n, self.pipeline.max_n)
        bias = logit_bias(req, self.pipeline.engine.tokenizer.n_vocab)
        async with self.pipeline.bounded("images", req.model) if image_urls(req.messages) else nullcontext():
            images = await self.pipeline.load_images(req)
            # rendering and tokenizing a long prompt takes a while: not on the event loop
            runs = await asyncio.to_thread(self._prepare, req, images, bias, max_tokens_ceiling, priority)
            # admission compiles the request's grammar (up to ~0.1 s at the limits): not on the event loop
            await self.pipeline.admit_all(runs, "response_format" if req.response_format else "tools")
        events = self._choice(runs[0], runs) if len(runs) == 1 else self._choices(runs)
        first = runs[0]
        return Reply(events, *(run.outputs for run in runs), id=first.id, created=first.created, model=first.model,
                     n=len(runs), logprobs=first.wants_logprobs, prompt_tokens=len(first.request.prompt_token_ids))

    def _prepare(self, req: ChatCompletionRequest, images: list, bias: dict[int, float] | None,
                 max_tokens_ceiling: bool, priority: int) -> list[Run]:
        """The request's ``n`` runs, sharing one prompt (the engines' prefix caches share its KV)."""
        plan = plan_tools(req, self.pipeline.tool_parser, self.pipeline.engine.model_info.grammar, self.pipeline.schema_limits)
        prompt = build_prompt(
            req, self.pipeline.template, self.pipeline.engine.tokenizer, self.pipeline.context_length, requested_max_tokens(req),
            plan=plan, tool_format=self.pipeline.tool_parser, images=images,
            processor=self.pipeline.engine.multimodal if self.pipeline.engine.model_info.vision else None,
            template_kwargs=template_kwargs(req, self.pipeline.default_template_kwargs),
            max_tokens_ceiling=max_tokens_ceiling, plain=self.pipeline.plain_text,
            normalize=self.pipeline.normalize,
        )
        parse_calls = self.pipeline.tool_parser and (plan.offered or PARSERS[self.pipeline.tool_parser].always_active)
        calls = self.pipeline.tool_parser if parse_calls else None
        sampling = to_sampling_params(req, prompt.max_tokens, self.pipeline.stop_token_ids, plan.grammar, bias)
        budget = self._reasoning_budget(req, plan.grammar)
        # a reply a grammar writes from its first token has no reasoning to end
        state = prompt_state(prompt.text) if self.pipeline.reasoning and not plan.grammar else "answer"
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        runs, stops = [], stop_strings(req)
        for i in range(req.n):
            request = GenerationRequest(
                request_id=rid if req.n == 1 else f"{rid}-{i}",
                prompt_token_ids=prompt.token_ids,
                sampling=choice_sampling(sampling, i),
                lora=req.model if req.model in self.pipeline.adapters else None,
                multimodal=prompt.multimodal,
                priority=priority,
                shown_special_ids=self.pipeline.shown_special_ids,
                token_by_token=bool(stops),
                **engine_scope(),
            )
            runs.append(Run(rid, created, request, stops, None,
                            output_parser(calls, plan.functions, self.pipeline.reasoning, prompt.text,
                                          plan.grammar is not None),
                            plan.forced_prefix, plan.max_calls, req.model, index=i,
                            reasoning_budget=budget, reasoning_state=state,
                            messages=prompt.messages, functions=plan.functions if parse_calls else []))
        return runs

    def _reasoning_budget(self, req: ChatCompletionRequest, grammar: str | None) -> int | None:
        """The reasoning budget for ``req``: its own ``thinking_token_budget``, else its
        ``reasoning_effort``'s (``EFFORT_BUDGETS``, on a template that does not read the
        variable itself), else the server's; None where there is none or nothing to end: a
        template without reasoning, or a reply constrained by a grammar from its first token."""
        budget = req.thinking_token_budget
        if budget is None and req.reasoning_effort and not self.pipeline.reads_effort:
            budget = EFFORT_BUDGETS[req.reasoning_effort]
        budget = self.pipeline.reasoning_budget if budget is None else budget
        return None if budget is None or not self.pipeline.reasoning or grammar else budget

    async def _choice(self, run: Run, last: list[Run] | None = None) -> AsyncIterator[ReplyEvent]:
        """Choice ``run.index``'s events, parsed (without a tool parser all text is content);
        with ``last`` (the request's runs, when this is its only choice) also the ``Done``."""
        parser, made_calls, choice = run.parser, False, run.index
        request, logprobs = run.request, run.wants_logprobs
        healer = healer_for(self.pipeline, run) if parser else None
        if parser and run.forced_prefix:
            parser.feed(run.forced_prefix)  # the name line the prompt already holds
        # tags' look-alikes, escaped by the engine, as the model wrote them (model_text)
        async for text, finish, token_logprobs in self.pipeline.deltas(run):
            if logprobs:
                yield Logprobs(token_logprobs, choice)
            if parser is None:
                if text:
                    yield TextDelta("content", model_text(request, text), 0, choice)
            else:
                events = parser.feed(text) + (parser.finish(truncated=finish == "length") if finish else [])
                if healer:  # calls held until checked against their schemas
                    events = healer.feed(events) + (await healer.finish(len(parser.unread)) if finish else [])
                for e in events:
                    if e.kind != "tool_call":
                        if e.text:
                            yield TextDelta(e.kind, model_text(request, e.text), 0, choice)
                        continue
                    if run.max_calls is not None and e.index >= run.max_calls:
                        continue
                    if e.name:
                        made_calls = True
                        yield CallStart(call_id(), model_text(request, e.name), e.index, choice)
                    if e.arguments:
                        yield TextDelta("arguments", model_text(request, e.arguments), e.index, choice)
            if finish:
                if parser is not None and parser.unread:
                    log.warning("%s: %d tool call(s) could not be read and came back as content: %s",
                                request.request_id, len(parser.unread), "; ".join(c[:200] for c in parser.unread))
                yield Finish(finish, run.stop_reason, made_calls, choice)
        if last is not None:
            yield Done(tokens(last))

    async def _choices(self, runs: list[Run]) -> AsyncIterator[ReplyEvent]:
        """The events of ``runs`` (the choices of ``n``), as they come, then the ``Done``."""
        async with aclosing(merged([self._choice(run) for run in runs])) as events:
            async for _, event in events:
                yield event
        yield Done(tokens(runs))
