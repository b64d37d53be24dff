"""GLM tool calling through the serving and HTTP layers, with a fake engine that replays what a
GLM model writes: the request mapping, the forced name, parsing of whole and streamed replies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from glmserve.chat import ChatTemplate
from glmserve.server import create_app
from glmserve.serving.chat.service import ChatService
from glmserve.serving.generation.pipeline import ModelPipeline
from tests.unit.fakes import SPECIAL, FakeEngine, one_model

FIXTURES = Path(__file__).parents[2] / "fixtures" / "glm"
TEMPLATES = {"glm4": (FIXTURES / "glm-4-9b-chat.jinja").read_text(), "glm45": (FIXTURES / "glm-4.6.jinja").read_text()}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}


def _http(parser: str, reply: str):
    engine = FakeEngine(reply=reply, context_length=4000, grammar=True)
    service = ChatService(ModelPipeline(engine, "glm", ChatTemplate(TEMPLATES[parser]), parser))
    return engine, service, TestClient(create_app(one_model(service)))


def _body(**kw):
    return {"model": "glm", "messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER], **kw}


def _stream(client, body) -> tuple[str, str, list[dict], str]:
    content, reasoning, calls, finish = "", "", {}, None
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as resp:
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choices = json.loads(line[6:])["choices"]
            if not choices:
                continue
            delta = choices[0]["delta"]
            content += delta.get("content") or ""
            reasoning += delta.get("reasoning_content") or ""
            for tc in delta.get("tool_calls") or []:
                call = calls.setdefault(tc["index"], {"name": "", "arguments": "", "ids": set()})
                call["name"] += tc["function"].get("name") or ""
                call["arguments"] += tc["function"].get("arguments") or ""
                if tc.get("id"):
                    call["ids"].add(tc["id"])
            finish = choices[0].get("finish_reason") or finish
    return content, reasoning, [calls[i] for i in sorted(calls)], finish


def test_stop_tokens_include_observation():
    engine, service, _ = _http("glm4", "x")
    assert set(service.pipeline.stop_token_ids) == {SPECIAL["<|user|>"], SPECIAL["<|observation|>"]}


@pytest.mark.parametrize("parser", ["glm4", "glm45"])
def test_plain_answers(parser):
    reply = "\nIt is sunny." if parser == "glm4" else "\n<think>Easy.</think>\nIt is sunny."
    _, _, client = _http(parser, reply)
    with client:
        message = client.post("/v1/chat/completions", json=_body()).json()["choices"][0]
        assert message["message"]["content"] == "It is sunny." and "tool_calls" not in message["message"]
        assert message["finish_reason"] == "stop"
        content, reasoning, calls, finish = _stream(client, _body())
        assert (content, calls, finish) == ("It is sunny.", [], "stop")
        assert reasoning == ("Easy." if parser == "glm45" else "")


@pytest.mark.parametrize(("parser", "reply"), [
    ("glm4", 'get_weather\n{"city": "Paris", "days": 2}'),
    ("glm45", "\n<think>Call the tool.</think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n"
              "<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>"),
])
def test_calls_whole_and_streamed(parser, reply):
    engine, _, client = _http(parser, reply)
    with client:
        body = client.post("/v1/chat/completions", json=_body()).json()
        choice = body["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        (call,) = choice["message"]["tool_calls"]
        assert call["type"] == "function" and call["id"].startswith("call_")
        assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'}
        assert choice["message"].get("content") is None
        content, reasoning, calls, finish = _stream(client, _body())
        assert finish == "tool_calls" and content == ""
        assert [(c["name"], c["arguments"]) for c in calls] == [("get_weather", '{"city": "Paris", "days": 2}')]
        assert len(calls[0]["ids"]) == 1  # one id for the call, on its first delta
        if parser == "glm45":
            assert choice["message"]["reasoning_content"] == reasoning == "Call the tool."
    prompt = engine.prompt_text(engine.requests[0])
    assert "get_weather" in prompt  # the tools were offered in the prompt


def test_glm4_named_tool_choice_forces_the_name_in_the_prompt():
    engine, _, client = _http("glm4", '{"city": "Paris"}')  # the model only writes the arguments
    with client:
        choice = {"type": "function", "function": {"name": "get_weather"}}
        body = client.post("/v1/chat/completions", json=_body(tool_choice=choice)).json()
    (call,) = body["choices"][0]["message"]["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    request = engine.requests[0]
    assert engine.prompt_text(request).endswith("<|assistant|>get_weather\n")
    assert request.sampling.grammar and "root ::=" in request.sampling.grammar


def test_tool_choice_none_offers_no_tools():
    engine, _, client = _http("glm4", "\nNo tools needed.")
    with client:
        body = client.post("/v1/chat/completions", json=_body(tool_choice="none")).json()
    assert body["choices"][0]["message"]["content"] == "No tools needed."
    assert "get_weather" not in engine.prompt_text(engine.requests[0])


def test_unknown_function_comes_back_as_content():
    _, _, client = _http("glm4", 'get_time\n{"tz": "UTC"}')
    with client:
        message = client.post("/v1/chat/completions", json=_body()).json()["choices"][0]["message"]
    assert message["content"] == 'get_time\n{"tz": "UTC"}' and "tool_calls" not in message


def test_responses_api_gives_reasoning_then_calls():
    """GLM-4.5 through /v1/responses: the <think> text is a reasoning item before the
    function_call item, whole and streamed."""
    _, _, client = _http("glm45", "\n<think>Call the tool.</think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n"
                                  "<arg_value>Paris</arg_value>\n</tool_call>")
    body = {"model": "glm", "input": "Weather in Paris?", "tools": [{"type": "function", **WEATHER["function"]}]}
    output = client.post("/v1/responses", json=body).json()["output"]
    assert [item["type"] for item in output] == ["reasoning", "function_call"]
    assert output[0]["content"][0]["text"] == "Call the tool."
    assert (output[1]["name"], json.loads(output[1]["arguments"])) == ("get_weather", {"city": "Paris"})
    events = []
    with client.stream("POST", "/v1/responses", json={**body, "stream": True}) as resp:
        events = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: {")]
    assert "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta") == "Call the tool."
    final = events[-1]
    assert final["type"] == "response.completed"
    assert [item["type"] for item in final["response"]["output"]] == ["reasoning", "function_call"]


def test_glm47_forced_calls_are_constrained_to_its_one_line_layout():
    """GLM-4.7 writes ``<tool_call>name<arg_key>...`` with no newlines and a zero-argument call
    as ``<tool_call>name</tool_call>``: the grammar for a forced call admits exactly that."""
    xgr = pytest.importorskip("xgrammar")
    from xgrammar.testing import _is_grammar_accept_string

    from glmserve.serving.structured.grammar import GLM47_CALLS, tool_call_grammar
    from glmserve.serving.structured.schema_check import SchemaLimits

    clock = {"name": "clock", "parameters": {"type": "object", "properties": {}}}
    weather = {"name": "get_weather", "parameters": {**WEATHER["function"]["parameters"], "required": ["city"]}}
    gbnf = tool_call_grammar(GLM47_CALLS, [clock, weather], ["tools.0", "tools.1"], SchemaLimits(), calls="distinct")
    grammar = xgr.Grammar.from_ebnf(gbnf)
    call = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>days</arg_key>" \
           "<arg_value>3</arg_value></tool_call>"
    for text in ("<tool_call>clock</tool_call>", call, "<tool_call>clock</tool_call>" + call):
        assert _is_grammar_accept_string(grammar, text), text
    for text in ("<tool_call>clock\n</tool_call>", call.replace("<arg_key>city", "\n<arg_key>city"),
                 call.replace("<arg_value>3<", "<arg_value>three<")):
        assert not _is_grammar_accept_string(grammar, text), text


def test_a_call_that_cannot_be_read_is_content_with_a_warning_naming_the_request(caplog):
    """An unknown function's call comes back as text, ``finish_reason`` ``stop``, and the log
    says which request it was (issue 75: never dropped silently)."""
    call = "<tool_call>launch_rockets\n<arg_key>count</arg_key>\n<arg_value>3</arg_value>\n</tool_call>"
    _, _, client = _http("glm45", call)
    with caplog.at_level("WARNING", logger="glmserve.chat"):
        reply = client.post("/v1/chat/completions", json=_body()).json()
    choice = reply["choices"][0]
    assert (choice["message"]["content"], choice["message"].get("tool_calls"), choice["finish_reason"]) == (
        call, None, "stop")
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any(reply["id"] in w and "launch_rockets" in w for w in warnings), warnings


def test_a_responses_string_input_has_no_length_bound_but_an_item_list_does():
    """``input`` as a string is the prompt's text, any length (a 5,000-character string was a
    400 "at most 4096 items"); as a list, at most ``MAX_INPUT_ITEMS`` items."""
    engine = FakeEngine(reply="Fine.", context_length=20_000)
    client = TestClient(create_app(one_model(ChatService(ModelPipeline(engine, "glm", ChatTemplate(TEMPLATES["glm4"]),
                                                                       "glm4")))))
    with client:
        ok = client.post("/v1/responses", json={"model": "glm", "input": "word " * 1000, "store": False})
        assert ok.status_code == 200 and ok.json()["output"][-1]["content"][0]["text"] == "Fine."
        items = [{"type": "message", "role": "user", "content": "hi"}] * 4097
        refused = client.post("/v1/responses", json={"model": "glm", "input": items, "store": False})
        assert refused.status_code == 400 and "4096" in refused.json()["error"]["message"]
