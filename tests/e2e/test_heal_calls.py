"""Calls that heal on a real engine: a tiny GLM trained here on GLM-4.7's template to call
``get_weather`` with no arguments (``{}``, where its schema requires ``city``), as GLM models
do now and then under load, served by the transformers engine with the default
``--heal-calls``. The call is decoded once more under the function's grammar, and every API
gets a call whose arguments match the schema, whole and streamed; ``/metrics`` counts it."""

from __future__ import annotations

import json

import anthropic
import httpx
import jsonschema
import openai
import pytest

from tests.conftest import RemoteServer

MODEL = "tiny-glm47-healer"
ASK = [{"role": "user", "content": "Weather in Bonn?"}]
PARAMETERS = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
              "required": ["city"]}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                            "parameters": PARAMETERS}}
BROKEN = "Look.</think><tool_call>get_weather</tool_call>"
# taught after the first token the grammar forces (the model's own next token there is </tool_call>)
FIXED = ("Look.</think><tool_call>get_weather<arg_key>", "city</arg_key><arg_value>Bonn</arg_value></tool_call>")


@pytest.fixture(scope="module")
def healer(tmp_path_factory):
    pytest.importorskip("torch")
    from tests.hf_models import tiny_glm_healer

    folder = tiny_glm_healer(tmp_path_factory.mktemp("healer") / MODEL, ASK, [WEATHER], BROKEN, FIXED)
    srv = RemoteServer("--engine", "transformers", "--model", str(folder), "--served-model-name", MODEL)
    yield srv
    srv.stop()


def test_a_call_that_fails_its_schema_comes_back_healed_on_every_api(healer):
    client = openai.OpenAI(base_url=f"{healer.url}/v1", api_key="unused", max_retries=0, timeout=300)
    kw = dict(model=MODEL, messages=ASK, tools=[WEATHER], temperature=0, max_tokens=200)
    whole = client.chat.completions.create(**kw).choices[0]
    assert whole.finish_reason == "tool_calls", whole.message
    [call] = whole.message.tool_calls
    healed = json.loads(call.function.arguments)  # as written: {}
    assert call.function.name == "get_weather" and healed["city"].startswith("Bon")
    jsonschema.validate(healed, PARAMETERS)
    metrics = httpx.get(f"{healer.url}/metrics").text
    assert f'glmserve:calls_healed_total{{model_name="{MODEL}",result="healed"}} 1.0' in metrics
    pieces = [call.function.arguments for chunk in client.chat.completions.create(**kw, stream=True)
              for call in (chunk.choices[0].delta.tool_calls or [] if chunk.choices else []) if call.function.arguments]
    assert json.loads("".join(pieces)) == healed

    messages = anthropic.Anthropic(base_url=healer.url, api_key="unused", max_retries=0, timeout=300)
    tool = {"name": "get_weather", "description": "Weather for a city", "input_schema": PARAMETERS}
    reply = messages.messages.create(model=MODEL, max_tokens=2000, messages=ASK, tools=[tool],
                                     extra_body={"temperature": 0}, thinking={"type": "enabled", "budget_tokens": 1024})
    assert [(b.name, b.input) for b in reply.content if b.type == "tool_use"] == [("get_weather", healed)]
