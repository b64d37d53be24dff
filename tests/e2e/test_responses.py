"""``/v1/responses`` (stateless) through the official ``openai`` client on the default server:
plain, streamed, a function tool with a ``function_call_output`` round trip, a json_schema
format, and what is refused."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.conftest import DEFAULT_MODEL
from tests.e2e.test_tools import SCHEMAS, TOOLS

FUNCTION_TOOLS = [{"type": "function", **t["function"]} for t in TOOLS]
ASK = "What is the weather like in Paris right now?"


def _create(client, **kw):
    kw.setdefault("max_output_tokens", 60)
    return client.responses.create(model=DEFAULT_MODEL, temperature=0, **kw)


def test_plain_text(client):
    response = _create(client, input="What is the capital of France?", instructions="You are a helpful AI assistant.")
    assert response.object == "response" and response.id.startswith("resp_")
    assert response.status in ("completed", "incomplete")
    assert "Paris" in response.output_text
    assert response.output[0].type == "message" and response.output[0].content[0].type == "output_text"
    assert response.usage.input_tokens > 0 and response.usage.output_tokens > 0
    cut = _create(client, input="Tell me a long story.", max_output_tokens=5)
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"


def test_stream_events_build_the_same_response(client):
    whole = _create(client, input="What is the capital of France?")
    events = list(_create(client, input="What is the capital of France?", stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == whole.status.join(
        ["response.", ""])
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == whole.output_text
    assert events[-1].response.output_text == whole.output_text
    assert {"response.output_item.added", "response.content_part.added", "response.output_text.done",
            "response.content_part.done", "response.output_item.done"} <= set(kinds)


def test_every_response_resource_field_plain_and_streamed(client):
    """Each field the Open Responses ResponseResource requires, with its type, in the JSON the
    server sends: the plain response and the last streamed one."""
    from tests.unit.serving.test_agent_requests import _resource_ok

    kw = dict(model=DEFAULT_MODEL, input="What is the capital of France?", max_output_tokens=8, temperature=0,
              prompt_cache_key="s-1", safety_identifier="u-1", truncation="auto", store=False)
    plain = client.responses.with_raw_response.create(**kw).http_response.json()
    _resource_ok(plain)
    assert (plain["prompt_cache_key"], plain["temperature"], plain["store"], plain["truncation"]) == (
        "s-1", 0.0, False, "auto")
    with client.responses.with_streaming_response.create(stream=True, **kw) as stream:
        events = [json.loads(line[6:]) for line in stream.iter_lines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
    assert events[-1]["type"] in ("response.completed", "response.incomplete")
    _resource_ok(events[-1]["response"])
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == plain["output"][0]["content"][0]["text"]


def test_function_call_round_trip(client):
    first = _create(client, input=ASK, tools=FUNCTION_TOOLS, tool_choice="required")
    calls = [item for item in first.output if item.type == "function_call"]
    assert calls and first.status == "completed"
    for call in calls:
        jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
    streamed = list(_create(client, input=ASK, tools=FUNCTION_TOOLS, tool_choice="required", stream=True))
    done = [e.item for e in streamed if e.type == "response.output_item.done" and e.item.type == "function_call"]
    assert [(c.name, c.arguments) for c in done] == [(c.name, c.arguments) for c in calls]
    assert "".join(e.delta for e in streamed if e.type == "response.function_call_arguments.delta") == "".join(
        c.arguments for c in calls)
    history = [{"role": "user", "content": ASK}, *[c.model_dump() for c in calls],
               *[{"type": "function_call_output", "call_id": c.call_id, "output": json.dumps({"temp_c": 18})}
                 for c in calls]]
    second = _create(client, input=history, tools=FUNCTION_TOOLS, tool_choice="none")
    assert second.output_text and not [i for i in second.output if i.type == "function_call"]


def test_named_tool_choice(client):
    response = _create(client, input=ASK, tools=FUNCTION_TOOLS, tool_choice={"type": "function", "name": "get_time"})
    assert [i.name for i in response.output if i.type == "function_call"] == ["get_time"]


def test_json_schema_format(client):
    schema = {"type": "object", "properties": {"population": {"type": "integer"}, "capital": {"type": "boolean"}},
              "required": ["population", "capital"], "additionalProperties": False}
    response = _create(client, input="Describe Paris as JSON.",
                       text={"format": {"type": "json_schema", "name": "city", "schema": schema}})
    jsonschema.validate(json.loads(response.output_text), schema)


@pytest.mark.parametrize("kw, param", [
    ({"previous_response_id": "resp_123"}, "previous_response_id"),
    ({"tools": [{"type": "custom", "name": "apply_patch"}]}, "tools.0.type"),
    ({"tools": [{"type": "web_search"}], "tool_choice": {"type": "web_search"}}, "tool_choice"),
    ({"input": [{"type": "computer_call"}]}, "input.0.type"),
])
def test_refused_with_400(client, kw, param):
    kw.setdefault("input", "Hi")
    with pytest.raises(openai.BadRequestError) as err:
        _create(client, **kw)
    assert err.value.body["param"] == param


def test_openai_agents_sdk_runs_an_agent_with_a_tool_to_its_end(server):
    """The Agents SDK's default model (OpenAIResponsesModel): the tool is forced with
    tool_choice (the default model is small); the SDK resets it after the call, feeds the
    result back, and the run ends with the model's text."""
    import agents
    from openai import AsyncOpenAI

    seen = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        seen.append(city)
        return f"It is sunny and 18 C in {city}."

    agents.set_tracing_disabled(True)
    model = agents.OpenAIResponsesModel(model=DEFAULT_MODEL, openai_client=AsyncOpenAI(
        base_url=f"{server.url}/v1", api_key="unused"))
    agent = agents.Agent(name="assistant", instructions="You are a helpful AI assistant.", model=model,
                         tools=[get_weather], model_settings=agents.ModelSettings(
                             tool_choice="get_weather", temperature=0, max_tokens=60))
    result = agents.Runner.run_sync(agent, "What is the weather in Paris?")
    assert seen and isinstance(result.final_output, str) and result.final_output
    kinds = [type(item).__name__ for item in result.new_items]
    assert kinds[:2] == ["ToolCallItem", "ToolCallOutputItem"] and kinds[-1] == "MessageOutputItem"
