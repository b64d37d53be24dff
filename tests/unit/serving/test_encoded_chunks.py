"""Chunks (events) of text written as JSON from a template (``FilledJSON``,
``ChatService.create(encoded=True)``, what ``/v1/chat/completions`` streams; Messages' and
Responses' ``encoded`` events): byte for byte the JSON of the objects they stand for, for every
character and through the real chat pipeline (text, reasoning and tool calls)."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest

from glmserve.chat import ChatTemplate
from glmserve.protocol.anthropic import MessagesRequest
from glmserve.protocol.responses import Response, ResponseEvent, ResponsesRequest
from glmserve.protocol.chat import (
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChunkChoice,
    DeltaMessage,
)
from glmserve.serving.chat.service import ChatService
from glmserve.serving.generation.pipeline import ModelPipeline
from glmserve.serving.generation.chunks import MARK, FilledJSON, NumberedJSON
from glmserve.serving.generation.reply import Done, Finish, Reply, TextDelta, Tokens
from glmserve.serving.messages.service import MessagesService
from glmserve.serving.responses.render import ResponseEvents
from glmserve.serving.responses.service import ResponsesService
from tests.unit.fakes import FakeEngine

GLM47 = (Path(__file__).parents[2] / "fixtures" / "glm" / "glm-4.7.jinja").read_text()
# quotes, backslashes, every kind of line break, control characters, non-ASCII and an emoji
TRICKY = 'say "hi"\\n\n\r\t\x00\x1f\x7f\x85\u2028\u2029 é 中 \U0001F600 </'


def _chunk(delta: DeltaMessage, index: int = 0) -> ChatCompletionChunk:
    return ChatCompletionChunk(id="chatcmpl-1", created=1700000000, model="glm-4.7",
                               choices=[ChunkChoice(index=index, delta=delta)])


@pytest.mark.parametrize("field", ["content", "reasoning_content"])
def test_filled_json_is_the_models_json_for_every_character(field):
    filled = FilledJSON(_chunk(DeltaMessage(**{field: MARK}), index=3))
    code_points = [*range(0xD800), *range(0xE000, 0x110000)]  # every one but the lone surrogates
    for start in range(0, len(code_points), 512):
        text = "".join(map(chr, code_points[start:start + 512]))
        assert filled.fill(text) == _chunk(DeltaMessage(**{field: text}), index=3).model_dump_json(exclude_none=True)
    assert filled.fill("") == _chunk(DeltaMessage(**{field: ""}), index=3).model_dump_json(exclude_none=True)


def test_a_template_must_hold_the_mark_once():
    with pytest.raises(ValueError, match="0 times"):
        FilledJSON(_chunk(DeltaMessage(content="no mark")))
    with pytest.raises(ValueError, match="2 times"):
        FilledJSON(_chunk(DeltaMessage(content=MARK, reasoning_content=MARK)))
    numbered = NumberedJSON(ResponseEvent(type="t", sequence_number=0, delta=MARK), "sequence_number")
    assert numbered.fill(12, 'a"b') == ResponseEvent(type="t", sequence_number=12, delta='a"b').model_dump_json()
    with pytest.raises(ValueError, match="0 times"):
        NumberedJSON(ResponseEvent(type="t", sequence_number=1, delta=MARK), "sequence_number")
    with pytest.raises(ValueError, match="0 times"):  # after the text
        NumberedJSON(ResponseEvent(type="t", sequence_number=1, delta=MARK, n=0), "n")


async def _collect(service: ChatService, body: dict, encoded: bool) -> list:
    stream = await service.create(ChatCompletionRequest.model_validate(body), encoded=encoded)
    items = [item async for item in stream]
    await stream.aclose()
    return items


def _json(items: list) -> list[str]:
    """Each item's JSON, the random ids (the completion's, the calls') and the time set aside."""
    dumped = [i if isinstance(i, str) else i.model_dump_json(exclude_none=True) for i in items]
    return [re.sub(r'"created":\d+', '"created":0', re.sub(r'"id":"(chatcmpl|call)-?_?[^"]+"', '"id":"x"', i))
            for i in dumped]


@pytest.mark.parametrize("extra", [{}, {"n": 2}, {"stream_options": {"include_usage": True}}])
def test_an_encoded_stream_is_the_objects_json(extra):
    """Reasoning, then content, each a chunk per character (the fake engine's tokens), with
    ``n`` choices and a usage chunk: the encoded stream's items are the object stream's JSON,
    and most of them came encoded."""
    engine = FakeEngine(reply=f"{TRICKY}</think>{TRICKY}", context_length=8000)
    service = ChatService(ModelPipeline(engine, "glm", ChatTemplate(GLM47), "glm47", max_n=2))
    body = {"model": "glm", "messages": [{"role": "user", "content": "Hi"}], "stream": True, **extra}
    plain, encoded = asyncio.run(_collect(service, body, False)), asyncio.run(_collect(service, body, True))
    assert not any(isinstance(i, str) for i in plain)
    assert _json(encoded) == _json(plain)
    # each choice's chunks but its first (the role) and its finish, and the usage chunk
    n = extra.get("n", 1)
    assert sum(isinstance(i, str) for i in encoded) == len(encoded) - 2 * n - ("stream_options" in extra)
    strings = [i for i in encoded if isinstance(i, str)]
    assert any('"reasoning_content":"\\u001f' in i for i in strings)  # both kinds, escapes and all
    assert any('"content":"\\n\\r\\t\\u0000"' in i for i in strings)


def test_logprobs_keep_chunks_as_objects():
    service = ChatService(ModelPipeline(FakeEngine(reply="Hello", context_length=8000), "glm", ChatTemplate(GLM47)))
    body = {"model": "glm", "messages": [{"role": "user", "content": "Hi"}], "stream": True, "logprobs": True}
    items = asyncio.run(_collect(service, body, True))
    assert len(items) > 3 and all(isinstance(i, ChatCompletionChunk) for i in items)
    assert all(i.choices[0].logprobs is not None for i in items[1:-1])  # each token its own chunk


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}
# GLM-4.7's call format (tests/fixtures/glm/glm-4.7.jinja): text, then two calls
CALLS = (f"{TRICKY}<tool_call>get_weather<arg_key>city</arg_key><arg_value>{TRICKY}</arg_value>"
         "<arg_key>days</arg_key><arg_value>3</arg_value></tool_call>"
         "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Oslo</arg_value></tool_call>")


async def _reply(service: ChatService, body: dict) -> list:
    reply = await service.reply(ChatCompletionRequest.model_validate(body))
    events = [event async for event in reply]
    await reply.aclose()
    return events


@pytest.mark.parametrize("reply, extra", [
    (f"{TRICKY}</think>{TRICKY}", {"n": 2}),
    (CALLS, {"tools": [WEATHER]}),
    (f"{TRICKY}</think>{CALLS}", {"tools": [WEATHER], "stream_options": {"include_usage": True}}),
])
def test_text_deltas_and_encoded_tool_arguments_are_the_objects(reply, extra):
    """Text, reasoning and tool calls (each argument piece a chunk of its own): the encoded
    stream is the object stream's JSON, each of the reply stream's ``TextDelta``s came as one
    encoded chunk, and what they hold is what the chunks hold."""
    engine = FakeEngine(reply=reply, context_length=8000)
    service = ChatService(ModelPipeline(engine, "glm", ChatTemplate(GLM47), "glm47", max_n=2))
    body = {"model": "glm", "messages": [{"role": "user", "content": "Hi"}], "stream": True, **extra}
    plain = asyncio.run(_collect(service, body, False))
    encoded = asyncio.run(_collect(service, body, True))
    events = asyncio.run(_reply(service, body))
    assert _json(plain) == _json(encoded)
    pieces = [e for e in events if isinstance(e, TextDelta)]
    assert pieces and all(p.text for p in pieces)
    assert len(pieces) == sum(isinstance(i, str) for i in encoded)
    joined: dict[tuple, str] = {}
    for chunk in plain:
        for choice in chunk.choices:
            d = choice.delta
            for kind, text in (("content", d.content), ("reasoning", d.reasoning_content)):
                if text:
                    joined[kind, 0, choice.index] = joined.get((kind, 0, choice.index), "") + text
            for call in d.tool_calls or []:
                if call.function.arguments:
                    key = ("arguments", call.index, choice.index)
                    joined[key] = joined.get(key, "") + call.function.arguments
    from_events: dict[tuple, str] = {}
    for p in pieces:
        from_events[p.kind, p.call, p.choice] = from_events.get((p.kind, p.call, p.choice), "") + p.text
    assert from_events == joined
    assert isinstance(events[-1], Done)
    if "tools" in extra:  # both calls' arguments, escapes and all
        assert {p.call for p in pieces if p.kind == "arguments"} == {0, 1}
        assert any('"arguments":"' in i and '\\u0000' in i for i in encoded if isinstance(i, str))
    else:
        assert {p.choice for p in pieces} == {0, 1} and {p.kind for p in pieces} == {"content", "reasoning"}


async def _message_events(body: dict, encoded: bool, reply: str) -> list:
    chat = ChatService(ModelPipeline(FakeEngine(reply=reply, context_length=8000), "glm", ChatTemplate(GLM47),
                                     "glm47"))
    stream = await MessagesService(chat.pipeline, chat).create(MessagesRequest.model_validate(body), encoded=encoded)
    items = [item async for item in stream]
    await stream.aclose()
    return items


def _sse(items: list) -> list[tuple[str, str]]:
    """Each event as the SSE layer sends it (``ANTHROPIC``): its type and JSON, ids set aside."""
    sent = [i if isinstance(i, dict) else {"event": i.type, "data": i.model_dump_json()} for i in items]
    return [(i["event"], re.sub(r'"(msg|toolu)_[0-9a-f]+"', '"x"', i["data"])) for i in sent]


@pytest.mark.parametrize("thinking", ["enabled", "disabled"])
def test_an_encoded_messages_stream_is_the_events_json(thinking):
    """Thinking, text and two tool calls through ``/v1/messages``' stream: the encoded events
    are the event objects' types and JSON, and every delta but a block's first (which opens a
    text or thinking block) came encoded."""
    body = {"model": "glm", "max_tokens": 4000, "stream": True, "messages": [{"role": "user", "content": "Hi"}],
            "tools": [{"name": "get_weather", "input_schema": WEATHER["function"]["parameters"]}],
            "thinking": {"type": thinking, **({"budget_tokens": 2000} if thinking == "enabled" else {})}}
    reply = f"{TRICKY}</think>{CALLS}" if thinking == "enabled" else CALLS  # CALLS: text, then the calls
    plain = asyncio.run(_message_events(body, False, reply))
    encoded = asyncio.run(_message_events(body, True, reply))
    assert not any(isinstance(i, dict) for i in plain)
    assert _sse(encoded) == _sse(plain)
    events = [(kind, json.loads(data)) for kind, data in _sse(plain)]
    deltas = [data["delta"] for kind, data in events if kind == "content_block_delta"]
    assert {d["type"] for d in deltas} == {"text_delta", "input_json_delta"} | (
        {"thinking_delta"} if thinking == "enabled" else set())
    assert "".join(d.get("text", "") for d in deltas) == TRICKY
    assert "".join(d.get("thinking", "") for d in deltas) == (TRICKY if thinking == "enabled" else "")
    arguments: dict[int, str] = {}
    for kind, data in events:
        if kind == "content_block_delta" and data["delta"]["type"] == "input_json_delta":
            arguments[data["index"]] = arguments.get(data["index"], "") + data["delta"]["partial_json"]
    assert [json.loads(a) for a in arguments.values()] == [{"city": TRICKY, "days": 3}, {"city": "Oslo"}]
    opened_by_a_delta = sum(kind == "content_block_start" and data["content_block"]["type"] != "tool_use"
                            for kind, data in events)
    assert sum(isinstance(i, dict) for i in encoded) == len(deltas) - opened_by_a_delta > 10


async def _response_events(body: dict, encoded: bool, reply: str) -> list:
    chat = ChatService(ModelPipeline(FakeEngine(reply=reply, context_length=8000), "glm", ChatTemplate(GLM47), "glm47"))
    stream = await ResponsesService(chat.pipeline, chat).create(ResponsesRequest.model_validate(body), encoded=encoded)
    items = [item async for item in stream]
    await stream.aclose()
    return items


def test_an_encoded_responses_stream_is_the_events_json():
    """Reasoning, text and two tool calls through ``/v1/responses``' stream: the encoded events
    are the event objects' JSON (ids and times set aside), numbered in order, and every delta
    but the first of a text item (it opens the item) came encoded."""
    body = {"model": "glm", "input": "Hi", "stream": True, "reasoning": {"effort": "high"},
            "tools": [{"type": "function", **WEATHER["function"]}]}
    reply = f"{TRICKY}</think>{CALLS}"
    plain = asyncio.run(_response_events(body, False, reply))
    encoded = asyncio.run(_response_events(body, True, reply))
    assert not any(isinstance(i, str) for i in plain)

    def sent(items: list) -> list[str]:
        dumped = [i if isinstance(i, str) else i.model_dump_json() for i in items]
        ids = [re.sub(r'"(resp|msg|rs|fc|call)_[0-9a-f]+"', '"x"', i) for i in dumped]
        return [re.sub(r'"(created|completed)_at":\d+', r'"\1_at":0', i) for i in ids]

    assert sent(encoded) == sent(plain)
    events = [json.loads(i) for i in sent(plain)]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    deltas = [e for e in events if e["type"].endswith(".delta")]
    assert {e["type"] for e in deltas} == {"response.reasoning_text.delta", "response.output_text.delta",
                                           "response.function_call_arguments.delta"}
    assert "".join(e["delta"] for e in deltas if e["type"] == "response.output_text.delta") == TRICKY
    assert "".join(e["delta"] for e in deltas if e["type"] == "response.reasoning_text.delta") == TRICKY
    done = events[-1]["response"]["output"]
    assert [json.loads(i["arguments"]) for i in done if i["type"] == "function_call"] == [
        {"city": TRICKY, "days": 3}, {"city": "Oslo"}]
    text_items = sum(e["type"] == "response.output_item.added" and e["item"]["type"] != "function_call"
                     for e in events)
    assert sum(isinstance(i, str) for i in encoded) == len(deltas) - text_items > 10


@pytest.mark.parametrize("encoded", [False, True])
def test_responses_drop_arguments_with_no_call_open(encoded):
    """A piece of a call's arguments while a message is open (no call head came first) makes
    no event and leaves the message's text and its encoded deltas as they were."""

    async def events():
        yield TextDelta("content", "Hello")
        yield TextDelta("arguments", '{"city": "Oslo"}')
        yield TextDelta("content", ' "there"')
        yield Finish("stop")
        yield Done(Tokens(1, 3))

    async def rendered():
        shell = Response(id="resp_1", created_at=1, status="in_progress", model="glm", tools=[], tool_choice="auto",
                         parallel_tool_calls=True, text={"format": {"type": "text"}})
        reply = Reply(events(), id="chatcmpl-1", created=1, model="glm", n=1, logprobs=False, prompt_tokens=1)
        return [e async for e in ResponseEvents(reply, shell, {}, None, encoded).events()]

    sent = [json.loads(e if isinstance(e, str) else e.model_dump_json()) for e in asyncio.run(rendered())]
    assert [e["delta"] for e in sent if e["type"].endswith(".delta")] == ["Hello", ' "there"']
    assert {e["type"] for e in sent if e["type"].endswith(".delta")} == {"response.output_text.delta"}
    assert sent[-1]["response"]["output"][0]["content"][0]["text"] == 'Hello "there"'
    assert [e["sequence_number"] for e in sent] == list(range(len(sent)))
