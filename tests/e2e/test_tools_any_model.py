"""Tool calling on a model whose chat template knows nothing of tools (the default SmolLM2, no
flags): the ``generic`` format, through the official ``openai`` client, on llama_cpp and on
transformers (the same weights converted to a Hugging Face folder)."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from tests.conftest import DEFAULT_MODEL, RemoteServer
from tests.e2e.test_tools import ASK, SCHEMAS, TOOLS, TIME, WEATHER

# LangChain's ChatOpenAI.bind_tools(..., tool_choice="required") body, as it sends it: pydantic
# schemas put "properties" before "type", and max_completion_tokens is 60
LANGCHAIN_TOOLS = [{"type": "function", "function": {
    "name": t["function"]["name"], "description": t["function"]["description"],
    "parameters": {"properties": t["function"]["parameters"]["properties"],
                   "required": t["function"]["parameters"]["required"], "type": "object"}}} for t in TOOLS]
RESULTS = {"get_weather": {"temperature": 18, "unit": "celsius", "sky": "sunny"}, "get_time": {"time": "14:05"}}


@pytest.fixture(scope="module", params=["llama_cpp", "transformers"])
def srv(request):
    """(server, model id): the default server, or the transformers engine on the same weights
    with the model's own template."""
    if request.param == "llama_cpp":
        yield request.getfixturevalue("server"), DEFAULT_MODEL
        return
    folder = request.getfixturevalue("smollm2_hf")
    server = RemoteServer("--engine", "transformers", "--model", str(folder), "--served-model-name", "smollm2-hf")
    yield server, "smollm2-hf"
    server.stop()


def _create(srv, **kw):
    server, model = srv
    kw.setdefault("max_tokens", 80)
    return server.client().chat.completions.create(model=model, messages=kw.pop("messages", ASK), temperature=0, **kw)


def _valid(call) -> dict:
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, SCHEMAS[call.function.name])
    return args


def _joined_stream(srv, **kw) -> tuple[str, list[tuple[str, str]], str]:
    content, calls, finish = "", {}, None
    for chunk in _create(srv, stream=True, **kw):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for tc in delta.tool_calls or []:
            name, args = calls.get(tc.index, ("", ""))
            calls[tc.index] = (name + (tc.function.name or ""), args + (tc.function.arguments or ""))
        finish = chunk.choices[0].finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish


def test_models_reports_the_generic_format(srv):
    server, model = srv
    card = next(m for m in server.client().models.list().data if m.id == model)
    assert card.model_extra["tool_call_parser"] == "generic"


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}],
                         ids=["required", "named"])
def test_forced_choice_gives_schema_valid_calls_plain_and_streamed(srv, choice):
    reply = _create(srv, tools=TOOLS, tool_choice=choice)
    message = reply.choices[0].message
    assert reply.choices[0].finish_reason == "tool_calls" and message.tool_calls and not message.content
    for call in message.tool_calls:
        _valid(call)
        assert call.id.startswith("call_") and call.type == "function"
    names = [c.function.name for c in message.tool_calls]
    assert len(names) == len(set(names))  # each function at most once
    if isinstance(choice, dict):
        assert names == ["get_time"]
    content, calls, finish = _joined_stream(srv, tools=TOOLS, tool_choice=choice)
    assert content == "" and finish == "tool_calls"
    assert calls == [(c.function.name, c.function.arguments) for c in message.tool_calls]


def test_a_message_with_calls_has_null_content(srv):
    server, model = srv
    body = {"model": model, "messages": ASK, "tools": TOOLS, "tool_choice": "required", "temperature": 0,
            "max_tokens": 80}
    message = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=300).json()["choices"][0]["message"]
    assert "content" in message and message["content"] is None and message["tool_calls"]


def test_auto_gives_text_or_valid_calls(srv):
    for messages in (ASK, [{"role": "user", "content": "Write one sentence about the sea."}]):
        message = _create(srv, messages=messages, tools=TOOLS, tool_choice="auto", max_tokens=40).choices[0].message
        if message.tool_calls:
            for call in message.tool_calls:
                _valid(call)
        else:
            assert message.content and not message.content.lstrip().startswith("{")


def test_agent_loop_runs_to_a_text_answer(srv):
    """The client's loop: call, run the tool, send the result back with the tools still offered
    (``auto``), until the model answers in text. A function called in this turn is not offered
    again, so the loop ends within len(tools) + 1 rounds even on a 135M model."""
    messages = list(ASK)
    for round_ in range(len(TOOLS) + 1):
        reply = _create(srv, messages=messages, tools=TOOLS, tool_choice="required" if round_ == 0 else "auto")
        message = reply.choices[0].message
        if not message.tool_calls:
            assert message.content and round_ > 0
            return
        messages.append({"role": "assistant", "content": None,
                         "tool_calls": [c.model_dump(exclude_none=True) for c in message.tool_calls]})
        for call in message.tool_calls:
            _valid(call)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(RESULTS[call.function.name])})
    pytest.fail(f"no text answer after {len(TOOLS) + 1} rounds: {messages}")


def test_langchain_required_body(srv):
    server, model = srv
    body = {"model": model, "messages": [{"role": "user", "content": "What is the weather like in Paris right now?"}],
            "tools": LANGCHAIN_TOOLS, "tool_choice": "required", "max_completion_tokens": 60, "stream": False,
            "temperature": 0}
    choice = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=300).json()["choices"][0]
    names = [c["function"]["name"] for c in choice["message"]["tool_calls"]]
    assert names and len(names) == len(set(names))  # exactly one call per function called
    assert not choice["message"]["content"]
    for call in choice["message"]["tool_calls"]:
        jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS[call["function"]["name"]])


def test_a_call_cut_by_max_tokens_does_not_leak_into_content(srv):
    for max_tokens in (8, 20):
        reply = _create(srv, tools=TOOLS, tool_choice="required", max_tokens=max_tokens)
        message = reply.choices[0].message
        assert reply.choices[0].finish_reason == "length"
        assert not message.content and not message.tool_calls  # the one call was not finished
        content, calls, finish = _joined_stream(srv, tools=TOOLS, tool_choice="required", max_tokens=max_tokens)
        assert (content, calls, finish) == ("", [], "length")


def test_tool_choice_none_answers_in_text(srv):
    message = _create(srv, tools=TOOLS, tool_choice="none", max_tokens=30).choices[0].message
    assert message.content and not message.tool_calls


def test_response_format_json_schema(srv):
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
              "required": ["city", "population"], "additionalProperties": False}
    reply = _create(srv, messages=[{"role": "user", "content": "Describe Paris as JSON."}], response_format={
        "type": "json_schema", "json_schema": {"name": "city", "schema": schema}})
    jsonschema.validate(json.loads(reply.choices[0].message.content), schema)
