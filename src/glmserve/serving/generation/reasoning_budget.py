"""A thinking budget, the same on every engine: after ``budget`` reasoning tokens the reasoning
is ended by writing the template's end-of-reasoning marker (``</think>``) and the answer follows.

Names as the field has them: llama-server's ``--reasoning-budget`` (server default; -1 none,
0 ends the reasoning at once), vLLM's ``thinking_token_budget`` (per chat request) and
Anthropic's ``thinking.budget_tokens``.

How: the engine's stream is read as it comes; once the reasoning has used ``budget`` tokens
without ending, that generation is stopped (closing the stream aborts it) and a continuation is
admitted whose prompt is the original prompt, the tokens generated so far and the marker's
tokens, with what is left of ``max_tokens``. The engines' prefix caches (llama.cpp, vLLM) hold
that prefix already, so the continuation starts at once. The client sees one stream: the
reasoning, the marker (the reasoning parser closes the reasoning on it, and usage counts its
tokens as generated), then the answer; usage keeps the first prompt's size and cache hits.

Where the reasoning starts is the reasoning parser's ``prompt_state``: counted from the first
token when the prompt opened it, from the model's own ``<think>`` otherwise, never when the
prompt closed it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing

from glmserve.engine.types import GenerationOutput, GenerationRequest
from glmserve.toolcalls.reasoning import THINK_END, PromptState, ReasoningParser

Admit = Callable[[GenerationRequest], Awaitable[AsyncIterator[GenerationOutput]]]


class _Tracker:
    """Counts reasoning tokens: the tokens of outputs written while the reasoning is open (as
    the reasoning parser sees the text, so ``<think>`` itself and the output that ends the
    reasoning are not counted); ``room(n)``: how many of the next ``n`` tokens the budget still
    allows (``n`` when the reasoning is not open)."""

    def __init__(self, budget: int, state: PromptState) -> None:
        self.budget = budget
        self.parser = ReasoningParser(None, state)
        self.used = 0

    @property
    def over(self) -> bool:
        return self.parser.in_reasoning and self.used >= self.budget

    def room(self, n: int) -> int:
        return min(n, self.budget - self.used) if self.parser.in_reasoning else n

    def add(self, text: str, n_tokens: int) -> None:
        was_reasoning = self.parser.in_reasoning
        self.parser.feed(text)
        if was_reasoning and self.parser.in_reasoning:
            self.used += n_tokens


async def budgeted(outputs: AsyncIterator[GenerationOutput], request: GenerationRequest, budget: int,
                   state: PromptState, end_token_ids: list[int], text_of: Callable[[list[int]], str],
                   admit: Admit) -> AsyncIterator[GenerationOutput]:
    """``outputs`` (the engine's stream for ``request``) with the reasoning ended after
    ``budget`` tokens: ``end_token_ids`` (the tokenized ``</think>``) are written and the
    generation goes on from there through ``admit`` (which hands a request to the engine and
    may raise the engine's admission errors). An output of several tokens (speculative
    decoding, vLLM's merged deltas) that crosses the budget is cut to it. ``text_of``: a
    sequence's token ids -> its whole text as the engine writes it (tags' look-alikes escaped:
    ``engine/rules.py`` ``sequence_text``); at the cut the text the engine had not yet released
    (the cut output's kept tokens, a tail its detokenizer held back) is what ``text_of`` gives
    beyond the text sent. Closing this iterator closes the engine streams."""
    tracker = _Tracker(budget, state)
    generated: list[int] = []
    sent = ""  # the text of the outputs yielded
    prompt_tokens = cached_tokens = 0
    async with aclosing(outputs) as stream:
        async for out in (stream if not tracker.over else _nothing()):
            keep = tracker.room(len(out.token_ids))
            if keep < len(out.token_ids):  # crosses the budget: cut to it
                kept = out.token_ids[:keep]
                out = dataclasses.replace(out, token_ids=kept, text=_unsent(text_of, [*generated, *kept], sent, kept),
                                          finish_reason=None, logprobs=out.logprobs[:keep] if out.logprobs else None)
            generated += out.token_ids
            sent += out.text
            prompt_tokens, cached_tokens = out.num_prompt_tokens or prompt_tokens, out.num_cached_tokens
            tracker.add(out.text, len(out.token_ids))
            yield out
            if out.finished:
                return
            if tracker.over:
                break
    held = _unsent(text_of, generated, sent, [])  # what the engine's detokenizer still held back
    left = request.sampling.max_tokens - len(generated) - len(end_token_ids)
    if left < 0:  # max_tokens leaves no room for the marker: the reasoning was cut by max_tokens
        yield GenerationOutput(request.request_id, [], held, "length", num_prompt_tokens=prompt_tokens,
                               num_cached_tokens=cached_tokens)
        return
    yield GenerationOutput(request.request_id, list(end_token_ids), held + THINK_END, "length" if left == 0 else None,
                           num_prompt_tokens=prompt_tokens, num_cached_tokens=cached_tokens)
    if left == 0:
        return
    follow = dataclasses.replace(
        request, request_id=f"{request.request_id}-answer",
        prompt_token_ids=[*request.prompt_token_ids, *generated, *end_token_ids],
        sampling=dataclasses.replace(request.sampling, max_tokens=left))
    extra = len(generated) + len(end_token_ids)
    async with aclosing(await admit(follow)) as rest:
        async for out in rest:
            out.request_id = request.request_id
            out.num_prompt_tokens = prompt_tokens or max(0, out.num_prompt_tokens - extra)
            out.num_cached_tokens = cached_tokens
            yield out


def _unsent(text_of: Callable[[list[int]], str], generated: list[int], sent: str, last: list[int]) -> str:
    """The text of ``generated`` beyond ``sent``; where ``sent`` is not its start (a
    detokenizer that wrote the text otherwise), the text of ``last`` alone."""
    whole = text_of(generated)
    return whole[len(sent):] if whole.startswith(sent) else text_of(last) if last else ""


async def _nothing() -> AsyncIterator[GenerationOutput]:
    return
    yield  # an empty async generator
