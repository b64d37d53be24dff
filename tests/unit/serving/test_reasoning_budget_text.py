"""The reasoning budget's cut goes through the escaper (issue 90): where an engine output of
several tokens crosses the budget (vLLM's merged deltas, speculative blocks), the kept tokens'
text is written as the engine writes it, a ``</think>`` spelled by ordinary tokens escaped and
a U+E000 the model wrote kept; and the text the engine's detokenizer held back at the cut (a
``<`` that might have begun a tag) is sent before the marker, not lost."""

from __future__ import annotations

import asyncio
import json

import pytest

from glmserve.engine.rules import TagEscaper, sequence_text, unescape_tags
from glmserve.engine.types import GenerationOutput, GenerationRequest, SamplingParams
from glmserve.serving.generation.reasoning_budget import budgeted
from glmserve.toolcalls.reasoning import ReasoningParser

END = 9001  # the tag token </think>
TAGS = {END: "</think>"}
THOUGHT = "1 </think> \ue000 if a <"  # as the model wrote it, one character a token
ANSWER = "Done."


def _decode(ids: list[int]) -> str:
    return "".join(TAGS.get(i) or chr(i) for i in ids)


def _engine(sizes: list[int], text: str):
    """An engine writing ``text`` (then ``MORE``), one output per ``sizes`` tokens, its text
    through a ``TagEscaper`` as the engines' detokenizers write it."""
    escaper = TagEscaper(TAGS.values())
    ids = [ord(c) for c in text + "MORE"]

    async def outputs():
        at = 0
        for size in sizes:
            chunk, at = ids[at:at + size], at + size
            yield GenerationOutput("r", chunk, "".join(escaper.feed(chr(t)) for t in chunk), None)
    return outputs()


async def _admit(follow: GenerationRequest):
    async def rest():
        yield GenerationOutput(follow.request_id, [ord(c) for c in ANSWER], ANSWER, "stop")
    return rest()


def _run(sizes: list[int]) -> str:
    request = GenerationRequest("r", [1, 2], SamplingParams(max_tokens=100))

    async def read():
        stream = budgeted(_engine(sizes, THOUGHT), request, len(THOUGHT), ReasoningParser(None, "reasoning"), [END],
                          lambda ids: sequence_text(ids, _decode, TAGS), _admit)
        return "".join([out.text async for out in stream])
    return asyncio.run(read())


@pytest.mark.parametrize("sizes", [[3, 30], [1] * len(THOUGHT) + [5], [len(THOUGHT) + 4], [2, 1, 9, 20]],
                         ids=["cut-in-a-block", "one-a-token", "one-block", "mixed"])
def test_the_budget_cut_writes_what_the_model_wrote(sizes):
    text = _run(sizes)
    parser = ReasoningParser(None, "reasoning")
    events = parser.feed(text) + parser.finish()
    reasoning = unescape_tags("".join(e.text for e in events if e.kind == "reasoning"))
    answer = unescape_tags("".join(e.text for e in events if e.kind == "content"))
    assert (reasoning, answer) == (THOUGHT.strip(), ANSWER)


def test_a_call_that_ends_the_reasoning_is_not_cut_by_the_budget():
    """A call's start tag written in the reasoning ends it for the budget as it does for the
    reply's parser (``ReasoningParser.phases``): a budget that the call's tokens would cross
    leaves the call whole (with a parser of the reasoning alone, the budget wrote ``</think>``
    into the call's JSON)."""
    from glmserve.toolcalls import assemble
    from glmserve.toolcalls.hermes import HermesParser

    tools = [{"name": "ls", "parameters": {"type": "object"}}]
    call = '<tool_call>\n{"name": "ls", "arguments": {"path": "/tmp"}}\n</tool_call>'
    reply = ReasoningParser(HermesParser(tools), "reasoning")
    request = GenerationRequest("r", [1, 2], SamplingParams(max_tokens=100))

    async def read():  # "ab" then the call: 2 tokens of reasoning, a budget of 14
        stream = budgeted(_engine([1] * len("ab" + call), "ab" + call), request, 14, reply.phases(), [END],
                          lambda ids: sequence_text(ids, _decode, TAGS), _admit)
        return "".join([out.text async for out in stream])
    text = asyncio.run(read())
    assert "</think>" not in text
    parsed = assemble(reply.feed(text) + reply.finish())
    assert (parsed.reasoning_content, [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls]) == (
        "ab", [("ls", {"path": "/tmp"})]), text
