"""``ModelPipeline``: one served model as every endpoint service sees it, and the generation
pipeline they share (the role of vLLM's ``OpenAIServingModels`` with its serving base's shared
pre- and post-processing).

It holds the engine; the names requests use (the served name, aliases, and the LoRA adapters of
``adapter_table``); the chat template and tool-call format with the stop tokens and special tags
they imply; the server's defaults (template variables, sampling, reasoning budget) and bounds
(``n``, client schemas, images); the model's metrics. Its pipeline, for a request the router
resolved to this model (``runtime/router.py``: the one place a ``model`` name is checked):
``load_images`` -> (the endpoint builds its ``Run``s) -> ``admit_all`` -> ``deltas`` (stop
strings, reasoning budget, metrics), the same for chat, completions, messages and responses.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import aclosing, asynccontextmanager
from typing import Any

from glmserve.chat import ChatTemplate, image_urls
from glmserve.engine.admission import AdmissionControl
from glmserve.engine.base import Engine, EngineOverloaded, GrammarError
from glmserve.engine.loops import Loop
from glmserve.engine.rules import escaped_tags, sequence_text
from glmserve.engine.types import GenerationOutput, GenerationRequest, TokenLogprob
from glmserve.multimodal import ImageError, MediaPolicy, load_images
from glmserve.protocol.chat import ChatCompletionRequest
from glmserve.protocol.errors import APIError, invalid_request, overloaded, server_error
from glmserve.serving.adapters import AdapterTable
from glmserve.serving.generation.request_scope import TENANT
from glmserve.serving.generation.metrics import ServingMetrics
from glmserve.chat.cache_report import PrefillStart, prefill_start
from glmserve.chat.normalize import RULES as NORMALIZE_RULES
from glmserve.chat.normalize import PromptNormalizer
from glmserve.chat.plain_text import PlainText
from glmserve.serving.generation.prompt import build_prompt, end_of_turn_token_ids, single_token_id, special_token_id
from glmserve.serving.generation.reasoning_budget import budgeted
from glmserve.serving.generation.run import Run
from glmserve.serving.generation.stop import StopStringMatcher
from glmserve.serving.generation.template_vars import reads_effort, template_kwargs
from glmserve.serving.generation.tools import plan_tools
from glmserve.serving.structured.schema_check import SchemaLimits
from glmserve.settings.model import ModelSettings
from glmserve.toolcalls import PARSERS, has_reasoning, tag_texts
from glmserve.toolcalls.reasoning import THINK_END, ReasoningParser

loop_log = logging.getLogger("glmserve.loop_guard")  # reasoning_budget.py's loop guard
prompt_log = logging.getLogger("glmserve.prompt")  # chat/normalize.py's removals, chat/cache_report.py's reports


class ModelPipeline:
    """See module docstring. Built once per started model (``runtime/start.py``); the endpoint
    services of the model take it."""

    def __init__(self, engine: Engine, served_model_name: str, template: ChatTemplate,
                 tool_parser: str | None = None, media_policy: MediaPolicy | None = None,
                 schema_limits: SchemaLimits | None = None, max_n: int = 1,
                 default_template_kwargs: dict[str, Any] | None = None,
                 generation_defaults: dict[str, float] | None = None, aliases: tuple[str, ...] = (),
                 reasoning_budget: int | None = None, adapter_table: AdapterTable | None = None,
                 prompt_normalize: tuple[str, ...] = tuple(NORMALIZE_RULES), loop_guard: str = "reasoning",
                 heal_calls: bool = True) -> None:
        """``tool_parser``: the model's tool-call format (a ``toolcalls.PARSERS`` name) or None;
        ``media_policy``: how ``image_url`` parts may be fetched (default: ``MediaPolicy()``);
        ``schema_limits``: bounds on client JSON schemas (default: ``SchemaLimits()``);
        ``max_n``: the largest ``n`` a request may ask for; ``default_template_kwargs``: chat
        template variables every request gets unless it sets them (``--default-chat-template-kwargs``);
        ``generation_defaults``: sampling fields for requests that leave them out
        (``--override-generation-config``); ``aliases``: other names of the base model (a
        ``--config`` entry's); ``reasoning_budget``: reasoning tokens before the reasoning is
        ended, for requests that set none (``--reasoning-budget``; None: no limit). Raises
        ``ValueError`` for a budget on a template that does not write ``<think>``;
        ``adapter_table``: the model's LoRA adapters, attached to ``engine`` by the caller
        (default: an empty table attached here); ``prompt_normalize``: the ``--prompt-normalize``
        rules (``chat/normalize.py``; raises ``ValueError`` for an unknown one); ``loop_guard``:
        ``--loop-guard`` (off, reasoning: on a template that writes reasoning, all: on any;
        ``reasoning_budget.py``); ``heal_calls``: ``--heal-calls`` (``serving/chat/heal.py``). Requests pick
        the base model by ``served_model_name`` or an alias, or a LoRA adapter by its name."""
        self.engine = engine
        self.name = served_model_name
        self.aliases = frozenset(aliases)
        # the model's LoRA adapters (start_model gives the table that outlives this engine)
        self.adapter_table = adapter_table or AdapterTable()
        if adapter_table is None:
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
        self.reads_effort = reads_effort(template.source)  # GLM-5.x: reasoning_effort is the template's
        # the parsers' tags that the vocabulary holds as single tokens: the engine writes their text, and
        # escapes the same characters written by other tokens (engine/rules.py TagEscaper)
        tags = ((single_token_id(engine.tokenizer, tag), tag) for tag in tag_texts(tool_parser, self.reasoning))
        self.shown_tags = {i: tag for i, tag in tags if i is not None}  # id -> text
        self.shown_special_ids = frozenset(self.shown_tags)
        # special tokens' texts and tags in a request's messages and tools are tokenized as text
        self.plain_text = PlainText(engine.tokenizer.special_texts() | set(tag_texts(tool_parser, self.reasoning)))
        self.normalize = PromptNormalizer(prompt_normalize)
        if reasoning_budget is not None and not self.reasoning:
            raise ValueError("--reasoning-budget needs a chat template that writes <think> reasoning; this "
                             "model's does not")
        self.reasoning_budget = reasoning_budget
        self.loop_guard = loop_guard == "all" or (loop_guard == "reasoning" and self.reasoning)
        self.heal_calls = heal_calls
        self._gates: dict[str, AdmissionControl] = {}  # what ``bounded`` counts, by kind
        self.end_of_reasoning_ids = engine.tokenizer.encode(THINK_END) if self.reasoning else []
        self.metrics = ServingMetrics(engine, served_model_name)

    @classmethod
    def from_settings(cls, engine: Engine, settings: ModelSettings, served_model_name: str, template: ChatTemplate,
                      tool_parser: str | None, aliases: tuple[str, ...] = (),
                      adapter_table: AdapterTable | None = None) -> ModelPipeline:
        """The pipeline of a model started with ``settings`` (its image limits, schema bounds,
        ``--max-n``, template variables, sampling defaults, reasoning budget and prompt
        normalization); the other arguments as ``__init__``'s. Raises ``ValueError`` as ``__init__`` does."""
        media = MediaPolicy(allowed_domains=frozenset(settings.allowed_media_domains),
                            max_bytes=settings.max_image_bytes, max_pixels=settings.max_image_pixels,
                            max_images=settings.max_images_per_request,
                            max_request_pixels=settings.max_image_pixels_per_request,
                            timeout_s=settings.image_fetch_timeout)
        limits = SchemaLimits(settings.max_schema_depth, settings.max_schema_nodes, settings.max_schema_repeat,
                              settings.max_grammar_bytes)
        return cls(engine, served_model_name, template, tool_parser, media, limits, settings.max_n,
                   settings.default_chat_template_kwargs, settings.override_generation_config, aliases,
                   None if settings.reasoning_budget < 0 else settings.reasoning_budget, adapter_table,
                   tuple(settings.prompt_normalize), settings.loop_guard, settings.heal_calls == "on")

    @property
    def adapters(self) -> tuple[str, ...]:
        """The LoRA adapters requests may name (``--lora``, and those loaded at run time; each
        is loaded in the engine when a request holds it: ``serving/adapters.py``)."""
        return self.adapter_table.names

    @asynccontextmanager
    async def bounded(self, kind: str, model: str) -> AsyncIterator[None]:
        """A place among the requests of ``kind`` that hold memory or the engine's thread
        before (or without) the engine's own admission: at most ``max_num_seqs + max_queue``
        at once (``engine/admission.py``, as the engine counts generations), else the 429 with
        ``Retry-After`` (for the requested ``model``). ``images``: a chat request from before
        its images are fetched until its runs are admitted (16 images of 20 MiB a request would
        otherwise be held by every request a client sends at once); ``embeddings``: an
        embeddings request (``engine.embed`` queues on the engine's thread without a bound)."""
        if kind not in self._gates:
            info = self.engine.model_info
            self._gates[kind] = AdmissionControl(info.max_num_seqs, info.max_queue)
        gate, tenant = self._gates[kind], TENANT.get()  # a key's share, as the engine's (admission.py)
        try:
            gate.acquire(tenant)
        except EngineOverloaded as exc:
            self.metrics.rejected.labels(model).inc()
            raise overloaded(f"{exc} ({kind})", exc.retry_after_s) from exc
        try:
            yield
        finally:
            gate.release(tenant)

    async def load_images(self, req: ChatCompletionRequest) -> list:
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
                            tool_format=self.tool_parser, check_fit=False, plain=self.plain_text,
                            normalize=self.normalize,
                            template_kwargs=template_kwargs(req, self.default_template_kwargs)).token_ids

    async def admit_all(self, runs: list[Run], grammar_param: str | None = None) -> None:
        """Admit every run, or none: when one is refused, the runs already admitted are aborted
        and its ``APIError`` is raised. A run with a grammar is admitted off the event loop (the
        engine compiles the grammar then)."""
        loop = asyncio.get_running_loop()
        admitted = []
        try:
            for run in runs:
                if run.request.sampling.grammar is None:  # a count and a check: no thread hop for it
                    run.outputs = self.admit(run.model, run.request, loop, grammar_param)
                else:
                    run.outputs = await asyncio.to_thread(self.admit, run.model, run.request, loop, grammar_param)
                admitted.append(run)
        except BaseException:
            for run in admitted:
                await run.outputs.aclose()
            raise

    def _looped(self, run: Run, where: str, found: Loop) -> None:
        """The loop guard found ``found`` in ``run``'s reasoning (ended) or answer (stopped)."""
        self.metrics.loops.labels(run.model, where).inc()
        loop_log.warning("%s: a period of %d tokens written %.1f times in a row (%d tokens) in the %s: %s",
                         run.request.request_id, found.period, found.repeats, found.span, where,
                         "the reasoning is ended" if where == "reasoning" else "stopped (finish_reason length)")

    async def _report_prefill(self, run: Run) -> None:
        """``run.prefill_start``, where its prompt's prefill started (the miss report,
        ``chat/cache_report.py``), for its usage; logged at debug on ``glmserve.prompt``. Placing
        the token in a message decodes the prompt (off the event loop): done for a chat prompt or
        for the log, else the token alone. Only the first choice's (``index`` 0): the others of
        ``n`` share its prompt, and ``tokens`` reports the first's."""
        if run.index:
            return
        ids, cached = run.request.prompt_token_ids, run.cached_tokens
        if not (run.messages or prompt_log.isEnabledFor(logging.DEBUG)):
            run.prefill_start = PrefillStart.at(cached, len(ids))
            return
        run.prefill_start = await asyncio.to_thread(prefill_start, self.engine.tokenizer.decode, ids, cached,
                                                    run.messages)
        prompt_log.debug("%s: %s", run.request.request_id, run.prefill_start)

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
        matcher = StopStringMatcher(run.stops, escaped=bool(escaped_tags(run.request)))
        pending: list[TokenLogprob] = []
        reason = "abort"  # unless the loop below ends otherwise (the client left)
        stream = run.outputs
        # ignore_eos asks for max_tokens tokens whatever they are (a benchmark's): no loop guard
        guard = self.loop_guard and not run.request.sampling.ignore_eos
        if run.reasoning_budget is not None or guard:
            loop = asyncio.get_running_loop()
            escaped = {i: self.shown_tags[i] for i in escaped_tags(run.request)}
            reasoning = (run.parser.phases() if isinstance(run.parser, ReasoningParser)
                         else ReasoningParser(None, run.reasoning_state))
            stream = budgeted(stream, run.request, run.reasoning_budget, reasoning,
                              self.end_of_reasoning_ids, lambda ids: sequence_text(ids, self.engine.tokenizer.decode,
                                                                                   escaped),
                              lambda follow: asyncio.to_thread(self.admit, run.model, follow, loop),
                              (lambda where, found: self._looped(run, where, found)) if guard else None)
        try:
            async with aclosing(stream) as outputs:
                async for out in outputs:
                    if out.token_ids and run.first_token_at is None:
                        run.first_token_at = time.perf_counter()
                    run.completion_tokens += len(out.token_ids)
                    run.token_ids += out.token_ids
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
                        await self._report_prefill(run)
                        yield text, "stop", pending
                        return
                    if out.finished:
                        reason = "length" if out.finish_reason == "length" else out.finish_reason or "stop"
                        await self._report_prefill(run)
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
