"""The reply stream: what the chat pipeline yields for one request, in no API's terms, and what
each API's renderer reads (chat completions: ``serving/chat/render.py``; Messages and Responses:
``serving/generation/blocks.py``'s ``BlockWriter`` under ``serving/messages/render.py`` and
``serving/responses/render.py``), whole or streamed.

Events, in the order a choice produced them (choices of ``n`` interleave, each event names its
``choice``):

- ``TextDelta``: the next piece of ``content`` or ``reasoning`` text, or of call ``call``'s JSON
  ``arguments``; never empty. What most tokens make.
- ``CallStart``: call ``call`` (0-based within the choice) begins: its ``call_id`` (24 hex
  digits, each API puts its own prefix on it: ``call_``, ``toolu_``) and function ``name``. Its
  argument pieces follow.
- ``Logprobs``: the log-probabilities of the tokens since the previous ``Logprobs`` (only for a
  request that asked for them), before the pieces those tokens made.
- ``Finish``: the choice ended: ``reason`` ``stop`` (end of turn, a stop token or string) or
  ``length`` (the token limit), ``stop_string`` the stop string matched, ``calls`` whether the
  choice made tool calls.
- ``Done``: every choice has finished: ``tokens``, the request's ``Tokens`` (last event).

A failure after the stream began is raised from the iteration as ``APIError``; a streaming
renderer writes it as its API's error event, a whole one lets it propagate.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from glmserve.chat.cache_report import PrefillStart
from glmserve.engine.types import TokenLogprob
from glmserve.protocol.usage import PrefillReport
from glmserve.serving.generation.chunks import ChunkStream


class TextDelta(NamedTuple):
    """A piece of ``content`` or ``reasoning`` text, or of the JSON ``arguments`` of call
    ``call``, whose ``CallStart`` came before; ``text`` is never empty."""

    kind: Literal["content", "reasoning", "arguments"]
    text: str
    call: int = 0
    choice: int = 0


class CallStart(NamedTuple):
    """Call ``call`` of choice ``choice`` begins: ``call_id`` (24 hex digits, no prefix) and
    the function's ``name``."""

    call_id: str
    name: str
    call: int = 0
    choice: int = 0


class Logprobs(NamedTuple):
    """The log-probabilities of choice ``choice``'s tokens since its previous ``Logprobs``."""

    logprobs: list[TokenLogprob]
    choice: int = 0


class Finish(NamedTuple):
    """Choice ``choice`` ended: ``reason`` ``stop`` or ``length``; ``stop_string``: the stop
    string that ended it, if one did; ``calls``: it made tool calls."""

    reason: Literal["stop", "length"]
    stop_string: str | None = None
    calls: bool = False
    choice: int = 0


class Tokens(NamedTuple):
    """A request's token counts: ``prompt`` (each prompt once, as OpenAI counts ``n``),
    ``completion`` (every choice), ``cached`` (prompt tokens read from the prefix cache), and
    ``prefill``: where its one prompt's prefill started (None: several prompts, or not known)."""

    prompt: int
    completion: int
    cached: int = 0
    prefill: PrefillStart | None = None


def prefill_report(prefill: PrefillStart | None) -> PrefillReport | None:
    """The usage extension (``protocol/usage.py``) of ``prefill``."""
    return None if prefill is None else PrefillReport(**prefill.report())


class Done(NamedTuple):
    """Every choice has finished; ``tokens``: the request's counts."""

    tokens: Tokens


ReplyEvent = TextDelta | CallStart | Logprobs | Finish | Done


def call_id() -> str:
    """A new call's id: 24 hex digits (as OpenAI's ``call_`` ids and Anthropic's ``toolu_`` ids
    after their prefixes)."""
    return uuid.uuid4().hex[:24]


class Reply(ChunkStream):
    """One request's reply stream (``ChatService.reply``): iterates its ``ReplyEvent``s;
    ``aclose()`` aborts its engine requests. ``id`` (``chatcmpl-`` and 32 hex digits), ``created``
    (Unix seconds), ``model`` (the requested name), ``n`` (choices), ``logprobs`` (the request
    asked for log-probabilities: its stream has ``Logprobs``), ``prompt_tokens`` (the prompt's
    length, known before the first event)."""

    __slots__ = ("id", "created", "model", "n", "logprobs")

    def __init__(self, events: AsyncIterator[ReplyEvent], *outputs, id: str, created: int, model: str, n: int,
                 logprobs: bool, prompt_tokens: int) -> None:
        super().__init__(events, *outputs, prompt_tokens=prompt_tokens)
        self.id, self.created, self.model, self.n, self.logprobs = id, created, model, n, logprobs


@dataclass(slots=True)
class Call:
    """A whole tool call: ``call_id`` (no prefix), ``name``, ``arguments`` (JSON text)."""

    call_id: str
    name: str
    arguments: str = ""


@dataclass(slots=True)
class Choice:
    """One choice's whole reply: ``reasoning`` (None when there was none), ``content`` (None
    when there was none but calls, ``""`` when there was nothing), ``calls``, its ``finish`` and,
    where asked for, its ``logprobs``."""

    reasoning: str | None
    content: str | None
    calls: list[Call]
    finish: Finish
    logprobs: list[TokenLogprob] = field(default_factory=list)


@dataclass(slots=True)
class Whole:
    """A whole reply: its ``choices`` in order and ``tokens``."""

    choices: list[Choice]
    tokens: Tokens


async def collect(reply: Reply) -> Whole:
    """``reply``'s events joined into a ``Whole`` (the stream closed after). Raises the
    ``APIError`` the stream raises."""
    n = reply.n
    texts: list[dict[str, list[str]]] = [{"content": [], "reasoning": []} for _ in range(n)]
    calls: list[dict[int, Call]] = [{} for _ in range(n)]
    logprobs: list[list[TokenLogprob]] = [[] for _ in range(n)]
    finishes = [Finish("stop", choice=i) for i in range(n)]
    tokens = Tokens(0, 0)
    try:
        async for event in reply:
            kind = type(event)
            if kind is TextDelta:
                if event.kind == "arguments":
                    if event.call in calls[event.choice]:
                        calls[event.choice][event.call].arguments += event.text
                else:
                    texts[event.choice][event.kind].append(event.text)
            elif kind is CallStart:
                calls[event.choice][event.call] = Call(event.call_id, event.name)
            elif kind is Logprobs:
                logprobs[event.choice] += event.logprobs
            elif kind is Finish:
                finishes[event.choice] = event
            elif kind is Done:
                tokens = event.tokens
    finally:
        await reply.aclose()
    choices = []
    for i in range(n):
        content, reasoning = "".join(texts[i]["content"]), "".join(texts[i]["reasoning"])
        made = list(calls[i].values())
        choices.append(Choice(reasoning or None, (content or None) if made else content, made, finishes[i],
                              logprobs[i]))
    return Whole(choices, tokens)
