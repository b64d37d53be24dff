"""Streams equal wholes on every API (issue 90): the hostile parser corpus
(``tests/unit/toolcalls/test_hostile.py``: a valid call cut at every point, random tag soup), fed
as the model would write it in pieces through the parser, as reply events
(``serving/generation/reply.py``) to the three stream writers (chat completions, Messages,
Responses); each stream, joined, gives the reasoning, content and calls of that API's whole
answer. Text the model wrote inside a call used to reach the Messages and Responses streams
between the call's argument pieces, which those writers then dropped (a call's JSON cut short)."""

from __future__ import annotations

import asyncio
import json

import pytest

from glmserve.protocol.responses import Response
from glmserve.serving.chat.render import chunks, completion
from glmserve.serving.generation.reply import CallStart, Done, Finish, Reply, TextDelta, Tokens, call_id, collect
from glmserve.serving.messages.render import MessageEvents, message
from glmserve.serving.responses.render import ResponseEvents, response
from glmserve.toolcalls import output_parser
from tests.unit.toolcalls.test_hostile import CALL, PROMPTS, TOOLS, soups


def _events(name: str, state: str, pieces: list[str]) -> list:
    """The reply events of a model writing ``pieces`` (as ``ChatService._choice`` makes them)."""
    parser, events, calls = output_parser(name, TOOLS, True, PROMPTS[state]), [], False
    parsed = [e for p in pieces for e in parser.feed(p)] + parser.finish()
    for e in parsed:
        if e.kind != "tool_call":
            events += [TextDelta(e.kind, e.text)] if e.text else []
            continue
        if e.name:
            calls = True
            events.append(CallStart(call_id(), e.name, e.index))
        if e.arguments:
            events.append(TextDelta("arguments", e.arguments, e.index))
    return [*events, Finish("stop", None, calls), Done(Tokens(3, 3))]


def _reply(events: list) -> Reply:
    async def gen():
        for event in events:
            yield event
    return Reply(gen(), id="chatcmpl-1", created=1, model="glm", n=1, logprobs=False, prompt_tokens=3)


def _run(agen) -> list:
    async def read():
        return [item async for item in agen]
    return asyncio.run(read())


def _shell() -> Response:
    return Response(id="resp_1", created_at=1, status="in_progress", model="glm", tools=[], tool_choice="auto",
                    parallel_tool_calls=True, text={"format": {"type": "text"}})


def _chat(events: list) -> tuple:
    whole = completion(_reply(events), asyncio.run(collect(_reply(events))), chr).choices[0].message
    expected = (whole.reasoning_content or "", whole.content or "",
                [(c.function.name, c.function.arguments) for c in whole.tool_calls or []])
    reasoning, content, calls = "", "", {}
    for chunk in _run(chunks(_reply(events), False, chr, False)):
        delta = chunk.choices[0].delta
        reasoning += delta.reasoning_content or ""
        content += delta.content or ""
        for call in delta.tool_calls or []:
            name, arguments = calls.get(call.index, ("", ""))
            calls[call.index] = (name + (call.function.name or ""), arguments + (call.function.arguments or ""))
    return (reasoning, content, [calls[i] for i in sorted(calls)]), expected


def _messages(events: list) -> tuple:
    whole = message(asyncio.run(collect(_reply(events))), "glm", True).model_dump()["content"]
    expected = ("".join(b.get("thinking", "") for b in whole), "".join(b.get("text", "") for b in whole),
                [(b["name"], b["input"]) for b in whole if b["type"] == "tool_use"])
    blocks: dict[int, dict] = {}
    for event in _run(MessageEvents(_reply(events), "glm", True, False).events()):
        data = event.model_dump() if hasattr(event, "model_dump") else event
        if data["type"] == "content_block_start":
            blocks[data["index"]] = {**data["content_block"], "json": ""}
        elif data["type"] == "content_block_delta":
            block, delta = blocks[data["index"]], data["delta"]
            block["thinking" if "thinking" in delta else "text" if "text" in delta else "json"] += (
                delta.get("thinking") or delta.get("text") or delta.get("partial_json") or "")
    streamed = [blocks[i] for i in sorted(blocks)]
    return ("".join(b.get("thinking", "") for b in streamed), "".join(b.get("text", "") for b in streamed),
            [(b["name"], json.loads(b["json"] or "{}")) for b in streamed if b["type"] == "tool_use"]), expected


def _responses(events: list) -> tuple:
    whole = response(_shell(), asyncio.run(collect(_reply(events))), {}, None).model_dump()["output"]
    expected = ("".join(i["content"][0]["text"] for i in whole if i["type"] == "reasoning"),
                "".join(i["content"][0]["text"] for i in whole if i["type"] == "message"),
                [(i["name"], i["arguments"]) for i in whole if i["type"] == "function_call"])
    reasoning, content, calls = "", "", {}
    for event in _run(ResponseEvents(_reply(events), _shell(), {}, None, False).events()):
        data = event.model_dump()
        if data["type"] == "response.output_item.added" and data["item"]["type"] == "function_call":
            calls[data["output_index"]] = (data["item"]["name"], "")
        elif data["type"] == "response.function_call_arguments.delta":
            name, arguments = calls[data["output_index"]]
            calls[data["output_index"]] = (name, arguments + data["delta"])
        elif data["type"] == "response.reasoning_text.delta":
            reasoning += data["delta"]
        elif data["type"] == "response.output_text.delta":
            content += data["delta"]
    return (reasoning, content, [calls[i] for i in sorted(calls)]), expected


WRITERS = {"chat": _chat, "messages": _messages, "responses": _responses}


@pytest.mark.parametrize("writer", list(WRITERS))
@pytest.mark.parametrize("name", ["glm45", "glm47"])
def test_every_stream_joins_to_its_whole_answer(writer, name):
    render = WRITERS[writer]
    cases = [(CALL[:cut], [CALL[:cut]]) for cut in range(1, len(CALL) + 1)]
    cases += [(soup, list(soup)) for soup, _ in soups(150)]
    cases += [("<tool_call>search\n<arg_key>query</arg_key>\n<arg_value>x</arg_value>\nLet me check.", None),
              ("<tool_call>get_weather<arg_key>city</arg_key><arg_value>Rome</arg_value>, <arg_key>days</arg_key>"
               "<arg_value>3</arg_value></tool_call>", None)]
    for state in PROMPTS:
        for text, pieces in cases:
            streamed, whole = render(_events(name, state, pieces or list(text)))
            assert streamed == whole, (state, text)
