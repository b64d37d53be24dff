"""``/v1/messages`` through the serving and HTTP layers with a fake engine that replays what a GLM-4.5
model writes: the request mapping (what the template is given), thinking and tool_use blocks,
the event sequence, the thinking switch, stop sequences and the max_tokens ceiling. The SDK tests
against real models are in ``tests/e2e/test_messages.py``."""

from __future__ import annotations

import json

from fastapi.testclient import TestClient

from glmserve.chat import ChatTemplate
from glmserve.server import AppOptions, create_app
from glmserve.serving.chat.service import ChatService
from glmserve.serving.generation.pipeline import ModelPipeline
from tests.unit.fakes import FakeEngine, one_model
from tests.unit.serving.test_serving_tools import TEMPLATES

WEATHER = {"name": "get_weather", "description": "Weather of a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}
CALL = ("\n<think>Call the tool.</think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n"
        "<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>")


def _client(reply: str, context_length: int = 4000, **app_kw) -> tuple[FakeEngine, TestClient]:
    engine = FakeEngine(reply=reply, context_length=context_length, grammar=True)
    service = ChatService(ModelPipeline(engine, "glm", ChatTemplate(TEMPLATES["glm45"]), "glm45"))
    return engine, TestClient(create_app(one_model(service), AppOptions(**app_kw)))


def _body(**kw) -> dict:
    """A request with Claude Code's ``thinking`` (``adaptive``: the model's default)."""
    return {"model": "glm", "max_tokens": 200, "messages": [{"role": "user", "content": "Weather in Paris?"}],
            "thinking": {"type": "adaptive"}, **kw}


def _events(client: TestClient, body: dict, headers: dict | None = None) -> list[tuple[str, dict]]:
    """(event name, data) of each SSE event."""
    out, name = [], None
    with client.stream("POST", "/v1/messages", json={**body, "stream": True}, headers=headers or {}) as resp:
        assert resp.status_code == 200, resp.read()
        for line in resp.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
                assert data["type"] == name
                out.append((name, data))
    return out


def test_reasoning_and_call_become_thinking_and_tool_use_blocks():
    engine, client = _client(CALL)
    # Claude Code's first system block changes with every request: it never reaches the prompt
    billing = {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.330.4f9; cc_entrypoint=cli; cch=1a2b3;"}
    body = _body(tools=[WEATHER], system=[billing, {"type": "text", "text": "Be brief."},
                                          {"type": "text", "text": "Use tools."}])
    message = client.post("/v1/messages", json=body).json()
    assert message["type"] == "message" and message["id"].startswith("msg_") and message["role"] == "assistant"
    assert [b["type"] for b in message["content"]] == ["thinking", "tool_use"]
    assert message["content"][0]["thinking"] == "Call the tool."
    use = message["content"][1]
    assert use["id"].startswith("toolu_") and (use["name"], use["input"]) == ("get_weather", {"city": "Paris", "days": 2})
    assert message["stop_reason"] == "tool_use" and message["stop_sequence"] is None
    prompt = engine.prompt_text(engine.requests[0])
    assert "<|system|>\nBe brief.\nUse tools." in prompt and '"name": "get_weather"' in prompt
    assert "billing" not in prompt

    events = _events(client, body)
    kinds = [k for k, _ in events]
    assert kinds[:2] == ["message_start", "ping"] and kinds[-2:] == ["message_delta", "message_stop"]
    runs = [k for i, k in enumerate(kinds[2:-2], 2) if k != kinds[i - 1]]  # repeated deltas as one
    assert runs == ["content_block_start", "content_block_delta", "content_block_stop",
                    "content_block_start", "content_block_delta", "content_block_stop"]
    starts = [d["content_block"] for k, d in events if k == "content_block_start"]
    assert [s["type"] for s in starts] == ["thinking", "tool_use"] and starts[1]["name"] == "get_weather"
    deltas = [d["delta"] for k, d in events if k == "content_block_delta"]
    assert "".join(d.get("thinking", "") for d in deltas) == "Call the tool."
    assert {d["type"] for d in deltas} == {"thinking_delta", "input_json_delta"}
    assert json.loads("".join(d.get("partial_json", "") for d in deltas)) == use["input"]
    indices = [d["index"] for k, d in events if k.startswith("content_block")]
    assert indices == sorted(indices) and set(indices) == {0, 1}
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["input_tokens"] > 0
    final = events[-2][1]
    assert final["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert final["usage"]["output_tokens"] == len(CALL)
    assert final["usage"]["input_tokens"] + final["usage"]["cache_read_input_tokens"] == \
        client.post("/v1/messages/count_tokens", json={k: v for k, v in body.items() if k != "max_tokens"}).json()[
            "input_tokens"]


def test_a_tool_round_trip_is_rendered_as_glm_writes_it():
    """tool_use and thinking blocks of the assistant turn and the tool_result of the next user
    turn reach the template as GLM's own turns: the reasoning replayed, the call as
    <tool_call>, the result as an observation; is_error marks the text."""
    engine, client = _client("\n<think></think>\nSunny, 24 C.")
    history = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Call the tool.", "signature": ""},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris", "days": 2}},
            {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {"city": "Atlantis"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny, 24 C"}]},
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": "no such city", "is_error": True}]},
    ]
    message = client.post("/v1/messages", json=_body(messages=history, tools=[WEATHER])).json()
    assert message["content"] == [{"type": "text", "text": "Sunny, 24 C."}] and message["stop_reason"] == "end_turn"
    prompt = engine.prompt_text(engine.requests[0])
    assert ("<|assistant|>\n<think>Call the tool.</think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n"
            "<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>") in prompt
    assert "<|observation|>\n<tool_response>\nsunny, 24 C\n</tool_response>\n<tool_response>\nError: no such city" \
        in prompt


def test_thinking_switch_and_mid_conversation_system():
    engine, client = _client("\nHi.")
    turns = [{"role": "user", "content": "Hello"}, {"role": "system", "content": "Reply in French."},
             {"role": "user", "content": [{"type": "text", "text": "Again"}]}]
    client.post("/v1/messages", json=_body(messages=turns, thinking={"type": "disabled"}))
    client.post("/v1/messages", json=_body(messages=turns, max_tokens=2000,
                                           thinking={"type": "enabled", "budget_tokens": 1024}))
    client.post("/v1/messages", json=_body(messages=turns, thinking={"type": "adaptive"}))
    off, on, adaptive = (engine.prompt_text(r) for r in engine.requests)
    assert off.endswith("Again/nothink<|assistant|>\n<think></think>") and "<|system|>\nReply in French." in off
    assert on.endswith("Again<|assistant|>") and adaptive == on


def test_chat_template_kwargs_on_the_openai_routes():
    """The same switch on chat completions: chat_template_kwargs, reasoning_effort, and the
    server's defaults (--default-chat-template-kwargs), the request's own winning."""
    engine = FakeEngine(reply="\nHi.", context_length=4000, grammar=True)
    service = ChatService(ModelPipeline(engine, "glm", ChatTemplate(TEMPLATES["glm45"]), "glm45",
                          default_template_kwargs={"enable_thinking": False}))
    client = TestClient(create_app(one_model(service)))
    msgs = [{"role": "user", "content": "Hello"}]
    for extra in ({}, {"chat_template_kwargs": {"enable_thinking": True}}, {"reasoning_effort": "high"},
                  {"reasoning_effort": "none"}, {"chat_template_kwargs": {"unused_by_template": 1}}):
        assert client.post("/v1/chat/completions", json={"model": "glm", "messages": msgs, **extra}).status_code == 200
    client.post("/v1/responses", json={"model": "glm", "input": "Hello", "reasoning": {"effort": "medium"}})
    prompts = [engine.prompt_text(r) for r in engine.requests]
    assert [p.endswith("<think></think>") for p in prompts] == [True, False, False, True, True, False]
    bad = client.post("/v1/chat/completions", json={"model": "glm", "messages": msgs,
                                                     "chat_template_kwargs": {"messages": []}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "chat_template_kwargs.messages"


def test_stop_sequence_and_max_tokens_ceiling():
    engine, client = _client("\nOne, two, three, four.", context_length=300)
    message = client.post("/v1/messages", json=_body(stop_sequences=["three"])).json()
    assert message["content"] == [{"type": "text", "text": "One, two,"}]
    assert (message["stop_reason"], message["stop_sequence"]) == ("stop_sequence", "three")
    events = _events(client, _body(stop_sequences=["three"]))
    assert events[-2][1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "three"}
    # 32000 does not fit a 300-token context: the reply gets what the prompt leaves
    message = client.post("/v1/messages", json=_body(max_tokens=32000)).json()
    assert message["stop_reason"] == "end_turn"
    assert engine.requests[-1].sampling.max_tokens == 300 - len(engine.requests[-1].prompt_token_ids)
    cut = client.post("/v1/messages", json=_body(max_tokens=5)).json()
    assert cut["stop_reason"] == "max_tokens" and cut["usage"]["output_tokens"] == 5


def test_errors_are_anthropic_envelopes_and_x_api_key_is_accepted():
    _, client = _client("\nHi.", api_key="sekret")
    headers = {"x-api-key": "sekret", "anthropic-version": "2023-06-01", "anthropic-beta": "a-beta,another"}
    assert client.post("/v1/messages", json=_body(), headers=headers).status_code == 200
    assert client.post("/v1/messages", json=_body(), headers={"authorization": "Bearer sekret"}).status_code == 200
    for bad_headers in ({}, {"x-api-key": "wrong"}):
        resp = client.post("/v1/messages", json=_body(), headers=bad_headers)
        assert resp.status_code == 401
        assert resp.json()["type"] == "error" and resp.json()["error"]["type"] == "authentication_error"
    # the OpenAI routes keep their bearer token and their envelope
    resp = client.post("/v1/chat/completions", json={"model": "glm", "messages": [{"role": "user", "content": "x"}]},
                       headers={"x-api-key": "sekret"})
    assert resp.status_code == 401 and resp.json()["error"]["code"] == "invalid_api_key"
    resp = client.post("/v1/messages", json=_body(model="nope"), headers=headers)
    assert resp.status_code == 404 and resp.json()["error"]["type"] == "not_found_error"
    resp = client.get("/v1/messages", headers=headers)
    assert resp.status_code == 405 and resp.json()["type"] == "error"
