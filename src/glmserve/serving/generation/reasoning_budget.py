"""Ending a reply early, the same on every engine: the reasoning ended after a thinking budget,
or where it loops, and an answer that loops stopped.

**A thinking budget**: after ``budget`` reasoning tokens the reasoning is ended by writing the
template's end-of-reasoning marker (``</think>``) and the answer follows. Names as the field has
them: llama-server's ``--reasoning-budget`` (server default; -1 none, 0 ends the reasoning at
once), vLLM's ``thinking_token_budget`` (per chat request) and Anthropic's
``thinking.budget_tokens``.

**The loop guard** (``--loop-guard``): where the generated tokens end in a loop
(``engine/loops.py``: a period of tokens repeated over a span, thresholds chosen on a corpus of
real text), a loop inside the reasoning ends the reasoning as the budget does, and the answer
follows; a loop inside the answer (text or a tool call) stops the reply with ``finish_reason``
``length``, as ``max_tokens`` would have a little later. Each is logged (logger
``glmserve.loop_guard``) and counted (``/metrics`` ``glmserve:loops_stopped_total``).

How the reasoning is ended: the engine's stream is read as it comes; once the reasoning is
over its budget or loops, that generation is stopped (closing the stream aborts it) and a
continuation is admitted whose prompt is the original prompt, the tokens generated so far and
the marker's tokens, with what is left of ``max_tokens``. The engines' prefix caches (llama.cpp,
vLLM) hold that prefix already, so the continuation starts at once. The client sees one
stream: the reasoning, the marker (the reasoning parser closes the reasoning on it, and usage
counts its tokens as generated), then the answer; usage keeps the first prompt's size and
cache hits.

Where the reasoning starts and ends is the reply's reasoning parser's (``ReasoningParser.phases``):
counted from the first token when the prompt opened it, from the model's own ``<think>``
otherwise, never when the prompt closed it; a tool call's start tag ends it as ``</think>``
does (a budget or a loop then never writes ``</think>`` into a call). Once the reasoning is over
the answer's text is not parsed again here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Literal

from glmserve.engine.loops import Loop, LoopDetector
from glmserve.engine.types import GenerationOutput, GenerationRequest
from glmserve.toolcalls.reasoning import THINK_END, ReasoningParser

Admit = Callable[[GenerationRequest], Awaitable[AsyncIterator[GenerationOutput]]]
OnLoop = Callable[[Literal["reasoning", "answer"], Loop], None]


class _Tracker:
    """Counts reasoning tokens: the tokens of outputs written while the reasoning is open (as
    the reasoning parser sees the text, so ``<think>`` itself and the output that ends the
    reasoning are not counted); ``room(n)``: how many of the next ``n`` tokens the budget still
    allows (``n`` when the reasoning is not open or there is no budget). With a loop detector,
    ``loop``: the loop the tokens of the current part (reasoning or answer) end in.
    ``parser``: a new parser of the reply's reasoning (``ReasoningParser.phases``)."""

    def __init__(self, budget: int | None, parser: ReasoningParser, guard: bool) -> None:
        self.budget = budget
        self.parser = parser
        self.used = 0
        self.guard = guard
        self.detector = LoopDetector() if guard else None
        self.loop: Loop | None = None

    @property
    def over(self) -> bool:
        """The reasoning is open and must end: the budget is spent, or it loops."""
        return self.parser.in_reasoning and (self.loop is not None or
                                             (self.budget is not None and self.used >= self.budget))

    def room(self, n: int) -> int:
        return min(n, self.budget - self.used) if self.parser.in_reasoning and self.budget is not None else n

    def seek(self, token_ids: list[int], limit: int) -> int:
        """How many of an output's first ``limit`` ``token_ids`` to keep: all of them, or those
        up to the token that ends a loop in the current part (``loop`` then set), so that a loop
        in an output of several tokens (merged by ``--stream-interval-ms``, speculative) is cut
        where one token at a time would have found it. Call before ``add``."""
        if self.detector is None:
            return limit
        found = self.detector.find(token_ids if limit == len(token_ids) else token_ids[:limit])
        if found is None:
            return limit
        kept, self.loop = found
        return kept

    def add(self, text: str, token_ids: list[int]) -> None:
        was_reasoning = self.parser.in_reasoning
        if not self.parser.settled:  # the answer's text needs no parsing here
            self.parser.feed(text)
        if was_reasoning and self.parser.in_reasoning:
            self.used += len(token_ids)
        if self.detector is not None and was_reasoning != self.parser.in_reasoning:
            self.detector = LoopDetector()  # a loop is sought within one part: the new part's tokens
            self.loop = self.detector.feed(token_ids)


async def budgeted(outputs: AsyncIterator[GenerationOutput], request: GenerationRequest, budget: int | None,
                   reasoning: ReasoningParser, end_token_ids: list[int], text_of: Callable[[list[int]], str],
                   admit: Admit, on_loop: OnLoop | None = None) -> AsyncIterator[GenerationOutput]:
    """``outputs`` (the engine's stream for ``request``) with the reasoning ended after
    ``budget`` tokens (None: no budget) and, with ``on_loop`` (the loop guard on; called with
    where and what loop was found), where it loops; an answer that loops is stopped.
    ``reasoning``: a new parser of the reply's reasoning (``ReasoningParser.phases`` of the
    reply's parser; ``ReasoningParser(None, "answer")`` for a template without reasoning). To end
    the reasoning ``end_token_ids`` (the tokenized ``</think>``; empty for a template without
    reasoning) are written and the generation goes on from there through ``admit`` (which hands
    a request to the engine and may raise the engine's admission errors). An output of several
    tokens (speculative decoding, vLLM's merged deltas) that crosses the budget is cut to it.
    ``text_of``: a sequence's token ids -> its whole text as the engine writes it (tags'
    look-alikes escaped: ``engine/rules.py`` ``sequence_text``); at the cut the text the engine
    had not yet released (the cut output's kept tokens, a tail its detokenizer held back) is what
    ``text_of`` gives beyond the text sent. Closing this iterator closes the engine streams."""
    tracker = _Tracker(budget, reasoning, on_loop is not None)
    generated: list[int] = []
    sent = ""  # the text of the outputs yielded
    prompt_tokens = cached_tokens = 0
    stream, follow, extra = outputs, None, 0
    while stream is not None:
        async with aclosing(stream) as parts:
            async for out in (parts if not tracker.over else _nothing()):
                if follow is not None:  # the continuation's, told as the first request's
                    out.request_id, out.num_prompt_tokens = request.request_id, prompt_tokens or max(
                        0, out.num_prompt_tokens - extra)
                    out.num_cached_tokens = cached_tokens
                keep = tracker.seek(out.token_ids, tracker.room(len(out.token_ids)))
                if keep < len(out.token_ids):  # crosses the budget or ends a loop: cut there
                    kept = out.token_ids[:keep]
                    out = dataclasses.replace(out, token_ids=kept, finish_reason=None,
                                              text=_unsent(text_of, [*generated, *kept], sent, kept),
                                              logprobs=out.logprobs[:keep] if out.logprobs else None)
                generated += out.token_ids
                sent += out.text
                if follow is None:
                    prompt_tokens, cached_tokens = out.num_prompt_tokens or prompt_tokens, out.num_cached_tokens
                tracker.add(out.text, out.token_ids)
                if tracker.loop is not None and on_loop is not None and not out.finished:
                    on_loop("reasoning" if tracker.parser.in_reasoning else "answer", tracker.loop)
                    if not tracker.parser.in_reasoning:  # the answer loops: stopped here
                        yield out
                        yield GenerationOutput(request.request_id, [], _unsent(text_of, generated, sent, []),
                                               "length", num_prompt_tokens=prompt_tokens,
                                               num_cached_tokens=cached_tokens)
                        return
                yield out
                if out.finished:
                    return
                if tracker.over:
                    break
        if not tracker.over:
            return  # the stream ended without a finished output (the engine closed it)
        held = _unsent(text_of, generated, sent, [])  # what the engine's detokenizer still held back
        left = request.sampling.max_tokens - len(generated) - len(end_token_ids)
        if left < 0:  # max_tokens leaves no room for the marker: the reasoning was cut by max_tokens
            yield GenerationOutput(request.request_id, [], held, "length", num_prompt_tokens=prompt_tokens,
                                   num_cached_tokens=cached_tokens)
            return
        marker = GenerationOutput(request.request_id, list(end_token_ids), held + THINK_END,
                                  "length" if left == 0 else None, num_prompt_tokens=prompt_tokens,
                                  num_cached_tokens=cached_tokens)
        generated += marker.token_ids
        sent += marker.text
        tracker.add(marker.text, marker.token_ids)
        yield marker
        if left == 0:
            return
        follow = dataclasses.replace(
            request, request_id=f"{request.request_id}-answer",
            prompt_token_ids=[*request.prompt_token_ids, *generated],
            sampling=dataclasses.replace(request.sampling, max_tokens=left))
        extra = len(generated)
        stream = await admit(follow)


def _unsent(text_of: Callable[[list[int]], str], generated: list[int], sent: str, last: list[int]) -> str:
    """The text of ``generated`` beyond ``sent``; where ``sent`` is not its start (a
    detokenizer that wrote the text otherwise), the text of ``last`` alone."""
    whole = text_of(generated)
    return whole[len(sent):] if whole.startswith(sent) else text_of(last) if last else ""


async def _nothing() -> AsyncIterator[GenerationOutput]:
    return
    yield  # an empty async generator
