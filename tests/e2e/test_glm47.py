"""GLM-4.7's generation prompt opens the reasoning (``<|assistant|><think>``): a tiny GLM trained
here on GLM-4.7's template to continue its prompt with ``reasoning</think>answer`` is served by
the transformers engine, and every API returns the reasoning as reasoning and the answer alone
as the answer, plain and streamed (vLLM shipped the answer with all of it: #33348). Another,
trained to answer with a GLM-4.7 call, streams the call's arguments in pieces as the values come
on each API, and the pieces join to the whole reply's arguments."""

from __future__ import annotations

import json

import anthropic
import openai
import pytest

from tests.conftest import RemoteServer

THOUGHT, ANSWER = "Two plus two makes four.", "The answer is 4."
ASK = [{"role": "user", "content": "What is 2+2?"}]
MODEL = "tiny-glm47"
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}
CALL = ("Look.</think><tool_call>get_weather<arg_key>city</arg_key><arg_value>Bonn am Rhein</arg_value>"
        "<arg_key>days</arg_key><arg_value>3</arg_value></tool_call>")
ARGUMENTS = {"city": "Bonn am Rhein", "days": 3}


@pytest.fixture(scope="module")
def thinker(tmp_path_factory):
    pytest.importorskip("torch")
    from tests.hf_models import tiny_glm_thinker

    folder = tiny_glm_thinker(tmp_path_factory.mktemp("glm47") / MODEL, ASK, f"{THOUGHT}</think>{ANSWER}",
                              template="glm-4.7.jinja")
    srv = RemoteServer("--engine", "transformers", "--model", str(folder), "--served-model-name", MODEL)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def caller(tmp_path_factory):
    pytest.importorskip("torch")
    from tests.hf_models import tiny_glm_thinker

    folder = tiny_glm_thinker(tmp_path_factory.mktemp("glm47-call") / MODEL, ASK, CALL, template="glm-4.7.jinja",
                              tools=[WEATHER], steps=1500)
    srv = RemoteServer("--engine", "transformers", "--model", str(folder), "--served-model-name", MODEL)
    yield srv
    srv.stop()


def _openai(srv: RemoteServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_chat_completions_split_reasoning_from_the_answer(thinker):
    client = _openai(thinker)
    message = client.chat.completions.create(model=MODEL, messages=ASK, temperature=0, max_tokens=80).choices[0].message
    assert (message.model_extra["reasoning_content"], message.content) == (THOUGHT, ANSWER)
    reasoning, content = "", ""
    for chunk in client.chat.completions.create(model=MODEL, messages=ASK, temperature=0, max_tokens=80, stream=True):
        if chunk.choices:
            reasoning += (chunk.choices[0].delta.model_extra or {}).get("reasoning_content") or ""
            content += chunk.choices[0].delta.content or ""
    assert (reasoning, content) == (THOUGHT, ANSWER)


def test_messages_return_a_thinking_block_and_the_answer(thinker):
    client = anthropic.Anthropic(base_url=thinker.url, api_key="unused", max_retries=0, timeout=120)
    kw = dict(model=MODEL, max_tokens=2000, messages=ASK, extra_body={"temperature": 0},
              thinking={"type": "enabled", "budget_tokens": 1024})  # max_tokens: a ceiling, above the budget
    message = client.messages.create(**kw)
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in message.content] == [
        ("thinking", THOUGHT), ("text", ANSWER)]
    with client.messages.stream(**kw) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert (final.content[0].thinking, final.content[1].text) == (THOUGHT, ANSWER)


def test_responses_return_a_reasoning_item_and_the_answer(thinker):
    client = _openai(thinker)
    response = client.responses.create(model=MODEL, input="What is 2+2?", temperature=0, max_output_tokens=80)
    assert [item.type for item in response.output] == ["reasoning", "message"]
    assert response.output[0].content[0].text == THOUGHT and response.output_text == ANSWER
    events = list(client.responses.create(model=MODEL, input="What is 2+2?", temperature=0, max_output_tokens=80,
                                          stream=True))
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == THOUGHT
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == ANSWER


def test_reasoning_comes_back_sealed_and_is_restored_from_it(thinker):
    """Codex CLI's loop (store: false, include reasoning.encrypted_content): the reasoning item
    carries the reasoning sealed; sent back, it is replayed to GLM-4.7's template as the same
    prompt the readable reasoning gives, and an edited one is refused."""
    client = _openai(thinker)
    first = client.responses.create(model=MODEL, input=ASK, temperature=0, max_output_tokens=80, store=False,
                                    include=["reasoning.encrypted_content"])
    reasoning, message = first.output
    assert reasoning.encrypted_content and "plus" not in reasoning.encrypted_content

    def prompt_tokens(item: dict) -> int:
        items = ASK + ([item] if item else []) + [message.model_dump(exclude_none=True),
                                                  {"role": "user", "content": "And 3+3?"}]
        return client.responses.create(model=MODEL, input=items, max_output_tokens=1, store=False).usage.input_tokens

    sealed = {"type": "reasoning", "summary": [], "encrypted_content": reasoning.encrypted_content}
    readable = {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": THOUGHT}]}
    assert prompt_tokens(sealed) == prompt_tokens(readable) > prompt_tokens({})
    token = reasoning.encrypted_content
    with pytest.raises(openai.BadRequestError, match="encrypted_content"):
        prompt_tokens({**sealed, "encrypted_content": token[:20] + ("x" if token[20] != "x" else "y") + token[21:]})


def test_thinking_off_gives_no_reasoning(thinker):
    client = _openai(thinker)
    message = client.chat.completions.create(model=MODEL, messages=ASK, temperature=0, max_tokens=20,
                                             reasoning_effort="none").choices[0].message
    assert (message.model_extra or {}).get("reasoning_content") is None
    reply = anthropic.Anthropic(base_url=thinker.url, api_key="unused", max_retries=0).messages.create(
        model=MODEL, max_tokens=20, messages=ASK, extra_body={"temperature": 0})
    assert {b.type for b in reply.content} <= {"text"}


def test_call_arguments_stream_in_pieces_on_every_api(caller):
    client = _openai(caller)
    kw = dict(model=MODEL, messages=ASK, tools=[WEATHER], temperature=0, max_tokens=300)
    whole = client.chat.completions.create(**kw).choices[0]
    assert whole.finish_reason == "tool_calls", whole.message
    assert [(c.function.name, json.loads(c.function.arguments)) for c in whole.message.tool_calls] == [
        ("get_weather", ARGUMENTS)]
    pieces = [call.function.arguments for chunk in client.chat.completions.create(**kw, stream=True)
              for call in (chunk.choices[0].delta.tool_calls or [] if chunk.choices else []) if call.function.arguments]
    assert len(pieces) > 3 and "".join(pieces) == whole.message.tool_calls[0].function.arguments

    messages = anthropic.Anthropic(base_url=caller.url, api_key="unused", max_retries=0, timeout=120)
    tool = {"name": "get_weather", "description": "Weather for a city",
            "input_schema": WEATHER["function"]["parameters"]}
    with messages.messages.stream(model=MODEL, max_tokens=2000, messages=ASK, tools=[tool],
                                  extra_body={"temperature": 0},
                                  thinking={"type": "enabled", "budget_tokens": 1024}) as stream:
        partial = [e.delta.partial_json for e in stream if e.type == "content_block_delta"
                   and e.delta.type == "input_json_delta"]
        final = stream.get_final_message()
    assert len(partial) > 3 and json.loads("".join(partial)) == ARGUMENTS
    assert [(b.type, getattr(b, "input", None)) for b in final.content if b.type == "tool_use"] == [
        ("tool_use", ARGUMENTS)]

    events = list(client.responses.create(model=MODEL, input=ASK, tools=[{"type": "function", **WEATHER["function"]}],
                                          temperature=0, max_output_tokens=300, stream=True))
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    done = [e.arguments for e in events if e.type == "response.function_call_arguments.done"]
    assert len(deltas) > 3 and [json.loads("".join(deltas))] == [json.loads(a) for a in done] == [ARGUMENTS]
