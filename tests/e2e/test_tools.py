"""Tool calling and structured outputs end to end: the real default model, constrained decoding,
the official ``openai`` client."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from tests.conftest import DEFAULT_MODEL, RemoteServer

TEMPLATE = Path(__file__).parent.parent / "fixtures" / "templates" / "chatml-hermes-tools.jinja"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Current time in a timezone",
    "parameters": {"type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]}}}
TOOLS = [WEATHER, TIME]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "system", "content": "You are a helpful AI assistant."},
       {"role": "user", "content": "What is the weather like in Paris right now?"}]


@pytest.fixture(scope="module")
def tool_server():
    srv = RemoteServer("--chat-template", str(TEMPLATE), "--tool-call-parser", "hermes")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def tclient(tool_server):
    return tool_server.client()


@pytest.fixture
def fresh_tclient():
    """A tool server of its own, for tests that compare two greedy runs token for token (see
    ``fresh_client`` in tests/conftest.py)."""
    srv = RemoteServer("--chat-template", str(TEMPLATE), "--tool-call-parser", "hermes")
    yield srv.client()
    srv.stop()


def _create(client, **kw):
    kw.setdefault("max_tokens", 120)
    return client.chat.completions.create(model=DEFAULT_MODEL, messages=kw.pop("messages", ASK), temperature=0, **kw)


def _joined_stream(client, **kw) -> tuple[str, dict[int, dict], str]:
    """Content, tool calls by index (id, name, arguments joined) and finish_reason of a stream."""
    content, calls, finish = [], {}, None
    for chunk in _create(client, stream=True, **kw):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content.append(delta.content or "")
        for tc in delta.tool_calls or []:
            call = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
            call["id"] = call["id"] or tc.id
            call["name"] += tc.function.name or "" if tc.function else ""
            call["arguments"] += tc.function.arguments or "" if tc.function else ""
        finish = chunk.choices[0].finish_reason or finish
    return "".join(content), calls, finish


def _assert_valid_call(name: str, arguments: str) -> dict:
    assert name in SCHEMAS
    args = json.loads(arguments)
    jsonschema.validate(args, SCHEMAS[name])
    return args


def assert_valid_tool_calls(reply) -> None:
    """``reply`` (a chat completion for ``TOOLS``) ended in calls whose arguments fit their schemas."""
    calls = reply.choices[0].message.tool_calls
    assert calls and reply.choices[0].finish_reason == "tool_calls"
    for call in calls:
        _assert_valid_call(call.function.name, call.function.arguments)


def test_models_reports_the_parser(tclient):
    assert tclient.models.list().data[0].model_extra["tool_call_parser"] == "hermes"


def test_required_gives_a_valid_call(tclient):
    reply = _create(tclient, tools=TOOLS, tool_choice="required", max_tokens=250)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert 1 <= len(choice.message.tool_calls) <= len(TOOLS)
    for call in choice.message.tool_calls:
        assert call.id.startswith("call_") and call.type == "function"
        _assert_valid_call(call.function.name, call.function.arguments)
    content, streamed, finish = _joined_stream(tclient, tools=TOOLS, tool_choice="required", max_tokens=250)
    assert finish == "tool_calls" and not content
    assert [(c["name"], c["arguments"]) for c in streamed.values()] == [
        (c.function.name, c.function.arguments) for c in choice.message.tool_calls]
    for call in streamed.values():
        _assert_valid_call(call["name"], call["arguments"])


def test_named_plain_and_streamed_agree(fresh_tclient):
    tclient = fresh_tclient
    choice = {"type": "function", "function": {"name": "get_weather"}}
    plain = _create(tclient, tools=TOOLS, tool_choice=choice)
    calls = plain.choices[0].message.tool_calls
    assert len(calls) == 1 and calls[0].function.name == "get_weather"
    args = _assert_valid_call("get_weather", calls[0].function.arguments)
    assert "paris" in args["city"].lower()
    assert plain.choices[0].finish_reason == "tool_calls"

    content, streamed, finish = _joined_stream(tclient, tools=TOOLS, tool_choice=choice)
    assert finish == "tool_calls"
    assert [(c["name"], c["arguments"]) for c in streamed.values()] == [("get_weather", calls[0].function.arguments)]
    assert (content or None) == plain.choices[0].message.content
    assert streamed[0]["id"].startswith("call_")


def test_parallel_tool_calls_false_allows_one_call(tclient):
    reply = _create(tclient, tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    assert len(reply.choices[0].message.tool_calls) == 1


def test_json_schema_response_format_validates(fresh_tclient):
    tclient = fresh_tclient
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"},
                                               "population": {"type": "integer"}},
              "required": ["city", "country", "population"], "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": schema, "strict": True}}
    messages = [{"role": "user", "content": "Describe Paris as JSON."}]
    plain = _create(tclient, messages=messages, response_format=fmt, max_tokens=200)
    jsonschema.validate(json.loads(plain.choices[0].message.content), schema)
    content, _, _ = _joined_stream(tclient, messages=messages, response_format=fmt, max_tokens=200)
    assert content == plain.choices[0].message.content


def test_json_object_response_format(tclient):
    reply = _create(tclient, messages=[{"role": "user", "content": "Describe a cat as a JSON object with the keys "
                                                                   "name and color."}],
                    response_format={"type": "json_object"}, max_tokens=150)
    assert reply.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(reply.choices[0].message.content), dict)


def test_agent_loop_runs_to_the_end(tclient):
    """LangChain-style: call -> tool result -> final answer."""
    messages = list(ASK)
    first = _create(tclient, messages=messages, tools=TOOLS, tool_choice="required")
    call = first.choices[0].message.tool_calls[0]
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id,
                     "content": json.dumps({"temperature": 18, "unit": "celsius", "sky": "sunny"})})
    final = _create(tclient, messages=messages, tools=TOOLS, tool_choice="none")
    assert final.choices[0].finish_reason in ("stop", "length")
    assert final.choices[0].message.content
    before = _create(tclient, messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=1)
    assert final.usage.prompt_tokens > before.usage.prompt_tokens + 20  # the call and its result are in the prompt


def test_auto_without_a_call_is_plain_content(tclient):
    reply = _create(tclient, messages=[{"role": "user", "content": "Say hello."}], tools=TOOLS, tool_choice="auto",
                    max_tokens=30)
    choice = reply.choices[0]
    if choice.message.tool_calls:  # the model may call; then the call must be valid
        for call in choice.message.tool_calls:
            _assert_valid_call(call.function.name, call.function.arguments)
    else:
        assert choice.message.content and choice.finish_reason in ("stop", "length")
