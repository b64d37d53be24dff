"""Chat completions' renderer of the reply stream (``serving/generation/reply.py``): the whole
``ChatCompletion`` (``completion``) or its ``ChatCompletionChunk``s (``chunks``), in OpenAI's
shapes: a call's id is ``call_`` and the reply's call id, the finish reason ``tool_calls`` for a
choice that stopped after making calls, ``stop_reason`` the stop string matched (vLLM's field).

The stream: each choice's role chunk first, then a chunk per piece (a call's head, with its id,
``type`` and name, then its argument pieces), each choice's finish in a chunk of its own and,
with ``include_usage``, a last chunk with ``usage`` and no choices; a failure after the start
ends it with the error body. Log-probabilities go on the first chunk after their tokens. A piece
of text alone in its chunk (what most tokens make) is written, where the caller asked for it
(``encoded``), as its JSON from a template (``FilledJSON``) instead of as a chunk object.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from glmserve.engine.types import TokenLogprob
from glmserve.protocol.chat import (
    ChatCompletion,
    ChatCompletionChunk,
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
from glmserve.serving.generation.chunks import MARK, FilledJSON, StreamItem
from glmserve.serving.generation.reply import CallStart, Done, Finish, Logprobs, Reply, TextDelta, Whole
from glmserve.serving.generation.run import chat_usage

Decode = Callable[[list[int]], str]  # token ids -> text (the model's tokenizer)


def finish_reason(finish: Finish) -> str:
    """OpenAI's ``finish_reason`` of ``finish``."""
    return "tool_calls" if finish.calls and finish.reason == "stop" else finish.reason


def logprobs_of(logprobs: list[TokenLogprob], decode: Decode) -> ChoiceLogprobs:
    """OpenAI's ``logprobs.content`` for ``logprobs`` (token text from the tokenizer, ``bytes``
    its UTF-8 encoding, as vLLM gives them)."""
    def entry(lp: TokenLogprob) -> TokenLogprobEntry:
        token = decode([lp.token_id])
        return TokenLogprobEntry(token=token, logprob=lp.logprob, bytes=list(token.encode("utf-8")),
                                 top_logprobs=[TopLogprob(token=t, logprob=v, bytes=list(t.encode("utf-8")))
                                               for t, v in ((decode([tid]), v) for tid, v in lp.top)])
    return ChoiceLogprobs(content=[entry(lp) for lp in logprobs])


def completion(reply: Reply, whole: Whole, decode: Decode) -> ChatCompletion:
    """The ``ChatCompletion`` of ``whole`` (``reply``'s joined)."""
    choices = []
    for i, c in enumerate(whole.choices):
        calls = [ToolCall(id=f"call_{call.call_id}", function=FunctionCall(name=call.name, arguments=call.arguments))
                 for call in c.calls]
        message = ChatMessage(content=c.content, tool_calls=calls or None, reasoning_content=c.reasoning)
        choices.append(Choice(index=i, message=message, finish_reason=finish_reason(c.finish),
                              stop_reason=c.finish.stop_string,
                              logprobs=logprobs_of(c.logprobs, decode) if reply.logprobs else None))
    return ChatCompletion(id=reply.id, created=reply.created, model=reply.model, choices=choices,
                          usage=chat_usage(whole.tokens))


def _delta(kind: str, text: str, call: int = 0) -> DeltaMessage:
    """The chunk delta of a ``TextDelta``'s ``kind``, ``text`` and ``call``."""
    if kind == "content":
        return DeltaMessage(content=text)
    if kind == "reasoning":
        return DeltaMessage(reasoning_content=text)
    return DeltaMessage(tool_calls=[DeltaToolCall(index=call, function=DeltaFunction(arguments=text))])


async def chunks(reply: Reply, include_usage: bool, decode: Decode, encoded: bool = False
                 ) -> AsyncIterator[StreamItem]:
    """``reply``'s chunks (see the module docstring); ``encoded``: pieces of text alone as their
    JSON (not for a reply with log-probabilities: its chunks carry them)."""

    def chunk(choice: int, delta: DeltaMessage, finish: Finish | None = None) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=reply.id, created=reply.created, model=reply.model, choices=[ChunkChoice(
            index=choice, delta=delta, finish_reason=finish_reason(finish) if finish else None,
            stop_reason=finish.stop_string if finish else None)])

    carried: list[list[TokenLogprob] | None] = [None] * reply.n  # logprobs not yet on a chunk

    def with_logprobs(item: ChatCompletionChunk, choice: int) -> ChatCompletionChunk:
        if carried[choice] is not None:
            item.choices[0].logprobs = logprobs_of(carried[choice], decode)
            carried[choice] = None
        return item

    templates: dict[tuple[str, int, int], FilledJSON] = {}  # (kind, call, choice) -> its chunk's template
    fast = encoded and not reply.logprobs
    for i in range(reply.n):
        yield chunk(i, DeltaMessage(role="assistant", content=""))
    try:
        async for event in reply:
            kind = type(event)
            if kind is TextDelta:
                if fast:
                    key = (event.kind, event.call, event.choice)
                    template = templates.get(key)
                    if template is None:
                        template = FilledJSON(chunk(event.choice, _delta(event.kind, MARK, event.call)))
                        templates[key] = template
                    yield template.fill(event.text)
                else:
                    yield with_logprobs(chunk(event.choice, _delta(event.kind, event.text, event.call)), event.choice)
            elif kind is CallStart:
                head = DeltaToolCall(index=event.call, id=f"call_{event.call_id}", type="function",
                                     function=DeltaFunction(name=event.name, arguments=""))
                yield with_logprobs(chunk(event.choice, DeltaMessage(tool_calls=[head])), event.choice)
            elif kind is Logprobs:
                carried[event.choice] = (carried[event.choice] or []) + event.logprobs
            elif kind is Finish:
                yield with_logprobs(chunk(event.choice, DeltaMessage(), event), event.choice)
            elif kind is Done and include_usage:
                yield ChatCompletionChunk(id=reply.id, created=reply.created, model=reply.model, choices=[],
                                          usage=chat_usage(event.tokens))
    except APIError as exc:
        yield exc.body()
