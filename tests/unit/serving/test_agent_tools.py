"""The tools coding agents offer, over the real app, chat template and parsers with the scripted
fake engine: Codex CLI's ``namespace`` tool (its functions offered, a call returned with its
``namespace``, whole and streamed, and its output taken back), hosted tools left out of both
APIs unless ``tool_choice`` forces one, and tool types nothing here serves refused by name."""

from __future__ import annotations

import json

import pytest

from tests.unit.serving.test_reasoning_routes import _client, _sse

SPAWN = {"type": "function", "name": "spawn_agent", "description": "Start a sub-agent",
         "parameters": {"type": "object", "properties": {"task": {"type": "string"}}}}
SHELL = {"type": "function", "name": "exec_command", "description": "Run a command",
         "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}
# what Codex CLI 0.169.0 offers (captured): functions, a namespace of functions, a hosted tool
CODEX_TOOLS = [SHELL, {"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents", "tools": [SPAWN]},
               {"type": "web_search", "external_web_access": False}]
CALL = "</think><tool_call>spawn_agent<arg_key>task</arg_key><arg_value>list files</arg_value></tool_call>"
ASK = [{"role": "user", "content": "Hand this to a sub-agent."}]


def test_a_namespaced_function_is_offered_and_its_call_names_the_namespace():
    engine, client = _client(CALL)
    body = {"model": "glm", "input": ASK, "tools": CODEX_TOOLS}
    response = client.post("/v1/responses", json=body)
    assert response.status_code == 200, response.text
    prompt = engine.prompt_text(engine.requests[-1])
    assert '"name": "spawn_agent"' in prompt and '"name": "exec_command"' in prompt
    assert "web_search" not in prompt  # the hosted tool is left out
    [call] = [item for item in response.json()["output"] if item["type"] == "function_call"]
    assert (call["name"], call["namespace"], json.loads(call["arguments"])) == (
        "spawn_agent", "multi_agent_v1", {"task": "list files"})
    events = _sse(client, "/v1/responses", body)
    [done] = [e["item"] for e in events if e["type"] == "response.output_item.done"
              and e["item"]["type"] == "function_call"]
    [added] = [e["item"] for e in events if e["type"] == "response.output_item.added"
               and e["item"]["type"] == "function_call"]
    assert done["namespace"] == added["namespace"] == "multi_agent_v1"

    # the call and its output go back in: the next prompt holds both
    history = ASK + [{k: call[k] for k in ("type", "call_id", "name", "namespace", "arguments")},
                     {"type": "function_call_output", "call_id": call["call_id"], "output": "agent 7 started"}]
    engine.reply = "</think>Started."
    again = client.post("/v1/responses", json={**body, "input": history})
    assert again.status_code == 200, again.text
    prompt = engine.prompt_text(engine.requests[-1])
    assert "<tool_call>spawn_agent<arg_key>task</arg_key><arg_value>list files</arg_value></tool_call>" in prompt
    assert "agent 7 started" in prompt and again.json()["output"][-1]["content"][0]["text"] == "Started."


def test_a_plain_function_call_has_no_namespace():
    _, client = _client("</think><tool_call>exec_command<arg_key>cmd</arg_key><arg_value>ls</arg_value></tool_call>")
    output = client.post("/v1/responses", json={"model": "glm", "input": ASK, "tools": CODEX_TOOLS}).json()["output"]
    [call] = [item for item in output if item["type"] == "function_call"]
    assert call["name"] == "exec_command" and "namespace" not in call


@pytest.mark.parametrize("hosted", [{"type": "web_search"}, {"type": "web_search_preview"}, {"type": "file_search"},
                                    {"type": "code_interpreter"}, {"type": "computer_use_preview"},
                                    {"type": "image_generation"}, {"type": "mcp", "server_label": "x"}])
def test_hosted_tools_are_left_out_unless_forced(hosted):
    engine, client = _client("</think>Hi.")
    ok = client.post("/v1/responses", json={"model": "glm", "input": ASK, "tools": [hosted, SHELL]})
    assert ok.status_code == 200, ok.text
    assert hosted["type"] not in engine.prompt_text(engine.requests[-1])
    only = client.post("/v1/responses", json={"model": "glm", "input": ASK, "tools": [hosted]})
    assert only.status_code == 200, only.text
    forced = client.post("/v1/responses", json={"model": "glm", "input": ASK, "tools": [hosted, SHELL],
                                                "tool_choice": {"type": hosted["type"]}})
    assert forced.status_code == 400
    assert forced.json()["error"]["param"] == "tool_choice" and hosted["type"] in forced.json()["error"]["message"]


@pytest.mark.parametrize(("tools", "param", "kind"), [
    ([{"type": "custom", "name": "apply_patch"}], "tools.0.type", "custom"),
    ([SHELL, {"type": "local_shell"}], "tools.1.type", "local_shell"),
    ([{"type": "namespace", "name": "ns", "description": "d", "tools": [{"type": "custom", "name": "x"}]}],
     "tools.0.tools.0.type", "custom"),
    ([{"type": "namespace", "name": "ns", "description": "d", "tools": [{"type": "namespace", "name": "n2"}]}],
     "tools.0.tools.0.type", "namespace"),
    ([{"type": "namespace", "name": "ns", "description": "d", "tools": [{"type": "function"}]}],
     "tools.0.tools.0.name", "name"),
])
def test_tool_types_nothing_here_serves_are_refused_by_name(tools, param, kind):
    _, client = _client("</think>Hi.")
    resp = client.post("/v1/responses", json={"model": "glm", "input": ASK, "tools": tools})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == param
    assert repr(kind) in resp.json()["error"]["message"]


def test_anthropic_server_tools_are_left_out_unless_forced():
    engine, client = _client("</think>Hi.")
    search = {"type": "web_search_20250305", "name": "web_search", "max_uses": 3}
    weather = {"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}
    body = {"model": "glm", "max_tokens": 50, "messages": ASK, "tools": [search, weather]}
    ok = client.post("/v1/messages", json=body)
    assert ok.status_code == 200, ok.text
    prompt = engine.prompt_text(engine.requests[-1])
    assert "get_weather" in prompt and "web_search" not in prompt
    assert client.post("/v1/messages", json={**body, "tools": [search], "tool_choice": {"type": "auto"}}).status_code == 200
    forced = client.post("/v1/messages", json={**body, "tool_choice": {"type": "tool", "name": "web_search"}})
    assert forced.status_code == 400 and "web_search_20250305" in forced.json()["error"]["message"]
    bash = client.post("/v1/messages", json={**body, "tools": [{"type": "bash_20250124", "name": "bash"}]})
    assert bash.status_code == 400 and "bash_20250124" in bash.json()["error"]["message"]
