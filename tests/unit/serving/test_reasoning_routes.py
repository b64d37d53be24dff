"""Reasoning that starts in the prompt (GLM-4.7's generation prompt ends in ``<think>``) on
every API, thinking switched off, and preserved thinking on the agent routes: over the real
app, chat template and parsers, with the scripted fake engine (the tiny trained GLM-4.7 thinker
in ``tests/e2e/test_glm47.py`` does the same with a real model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from glmserve.chat import ChatTemplate
from glmserve.server import create_app
from glmserve.serving.chat.service import ChatService
from glmserve.serving.generation.pipeline import ModelPipeline
from tests.unit.fakes import FakeEngine, one_model
from tests.unit.serving.test_messages_mapping import _events as message_events
from tests.unit.serving.test_serving_tools import _stream as chat_stream

GLM47 = (Path(__file__).parents[2] / "fixtures" / "glm" / "glm-4.7.jinja").read_text()
# a template that always opens the reasoning (DeepSeek-R1 distills): thinking cannot be turned off
ALWAYS_THINKS = ("{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content.split('</think>')[-1] }}<|im_end|>\n"
                 "{%- endfor %}<|im_start|>assistant\n<think>\n")
THOUGHT, ANSWER = "Two plus two makes four.", "The answer is 4."
REPLY = f"{THOUGHT}</think>{ANSWER}"
ASK = [{"role": "user", "content": "What is 2+2?"}]
WEATHER = {"name": "get_weather", "description": "Weather of a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}


def _client(reply: str, template: str = GLM47, parser: str | None = "glm47",
            context_length: int = 8000, loop_guard: str = "reasoning") -> tuple[FakeEngine, TestClient]:
    engine = FakeEngine(reply=reply, context_length=context_length, grammar=True)
    return engine, TestClient(create_app(one_model(ModelPipeline(engine, "glm", ChatTemplate(template), parser,
                                                                 loop_guard=loop_guard))))


def _sse(client: TestClient, path: str, body: dict) -> list[dict]:
    with client.stream("POST", path, json={**body, "stream": True}) as resp:
        assert resp.status_code == 200, resp.read()
        return [json.loads(line[6:]) for line in resp.iter_lines()
                if line.startswith("data: ") and line != "data: [DONE]"]


def test_prompt_opened_reasoning_on_every_api():
    engine, client = _client(REPLY)
    chat = client.post("/v1/chat/completions", json={"model": "glm", "messages": ASK}).json()
    assert engine.prompt_text(engine.requests[-1]).endswith("<|assistant|><think>")
    message = chat["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == (THOUGHT, ANSWER)
    content, reasoning, _, finish = chat_stream(client, {"model": "glm", "messages": ASK})
    assert (reasoning, content, finish) == (THOUGHT, ANSWER, "stop")

    body = {"model": "glm", "max_tokens": 200, "messages": ASK, "thinking": {"type": "adaptive"}}
    reply = client.post("/v1/messages", json=body).json()
    assert reply["content"] == [{"type": "thinking", "thinking": THOUGHT, "signature": ""},
                                {"type": "text", "text": ANSWER}]
    deltas = [d["delta"] for k, d in message_events(client, body) if k == "content_block_delta"]
    assert "".join(d.get("thinking", "") for d in deltas) == THOUGHT
    assert "".join(d.get("text", "") for d in deltas) == ANSWER

    body = {"model": "glm", "input": "What is 2+2?"}
    output = client.post("/v1/responses", json=body).json()["output"]
    assert [i["type"] for i in output] == ["reasoning", "message"]
    assert output[0]["content"] == [{"type": "reasoning_text", "text": THOUGHT}]
    assert output[1]["content"][0]["text"] == ANSWER
    events = _sse(client, "/v1/responses", body)
    assert "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta") == THOUGHT
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == ANSWER


def test_thinking_off_gives_no_reasoning():
    engine, client = _client(ANSWER)
    chat = client.post("/v1/chat/completions", json={"model": "glm", "messages": ASK, "reasoning_effort": "none"})
    assert engine.prompt_text(engine.requests[-1]).endswith("<|assistant|></think>")
    assert chat.json()["choices"][0]["message"].get("reasoning_content") is None
    # /v1/messages without "thinking" is thinking off, as on Anthropic's API
    reply = client.post("/v1/messages", json={"model": "glm", "max_tokens": 50, "messages": ASK}).json()
    assert engine.prompt_text(engine.requests[-1]).endswith("<|assistant|></think>")
    assert reply["content"] == [{"type": "text", "text": ANSWER}]


def test_a_template_that_always_thinks_gets_no_thinking_blocks_unless_asked():
    engine, client = _client(f"\n{THOUGHT}\n</think>\n\n{ANSWER}", ALWAYS_THINKS, parser=None)
    chat = client.post("/v1/chat/completions", json={"model": "glm", "messages": ASK}).json()["choices"][0]
    assert (chat["message"].get("reasoning_content"), chat["message"]["content"]) == (THOUGHT, ANSWER)
    body = {"model": "glm", "max_tokens": 200, "messages": ASK}
    assert client.post("/v1/messages", json=body).json()["content"] == [{"type": "text", "text": ANSWER}]
    assert {d["type"] for k, d in message_events(client, body) if k == "content_block_start" for d in
            [d["content_block"]]} == {"text"}
    thinking = client.post("/v1/messages", json={**body, "max_tokens": 2000,
                                                  "thinking": {"type": "enabled", "budget_tokens": 1024}})
    assert [b["type"] for b in thinking.json()["content"]] == ["thinking", "text"]


def _call(city: str) -> str:
    return f"<tool_call>get_weather<arg_key>city</arg_key><arg_value>{city}</arg_value></tool_call>"


# the agent's turns: three tool calls, then an answer; then the user replies
SCRIPT = [f"Look up Paris.</think>{_call('Paris')}", f"Now Rome.</think>{_call('Rome')}",
          f"And Oslo.</think>{_call('Oslo')}", "All three known.</think>Sunny everywhere."]


def _messages_turn(client: TestClient, history: list[dict]) -> list[dict]:
    """One /v1/messages request; returns the turns to append (assistant, then results or nothing)."""
    body = {"model": "glm", "max_tokens": 300, "messages": history, "thinking": {"type": "adaptive"},
            "tools": [{"name": WEATHER["name"], "description": WEATHER["description"],
                       "input_schema": WEATHER["parameters"]}]}
    reply = client.post("/v1/messages", json=body).json()
    uses = [b for b in reply["content"] if b["type"] == "tool_use"]
    results = [{"type": "tool_result", "tool_use_id": b["id"], "content": "Sunny."} for b in uses]
    return [{"role": "assistant", "content": reply["content"]}] + ([{"role": "user", "content": results}] if uses else [])


def _responses_turn(client: TestClient, history: list[dict]) -> list[dict]:
    body = {"model": "glm", "input": history, "tools": [{"type": "function", **WEATHER}]}
    output = client.post("/v1/responses", json=body).json()["output"]
    results = [{"type": "function_call_output", "call_id": i["call_id"], "output": "Sunny."}
               for i in output if i["type"] == "function_call"]
    return output + results


def _shared(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@pytest.mark.parametrize("route", ["messages", "responses"])
def test_the_next_prompt_extends_the_last_one_after_a_tool_chain_and_a_user_reply(route):
    """Preserved thinking: with GLM-4.7's default (clear_thinking true) a user reply collapses
    every earlier turn's reasoning to ``</think>`` and the prompt changes at the chain's first
    turn; the agent routes keep it, so each prompt starts with the previous prompt and reply."""
    engine, client = _client("")
    turn = _messages_turn if route == "messages" else _responses_turn
    user = (lambda text: {"role": "user", "content": text})
    history = [user("Weather in Paris, Rome and Oslo?")]
    for reply in SCRIPT:
        engine.reply = reply
        history += turn(client, history)
    history.append(user("Thanks! And tomorrow?"))
    engine.reply = "No idea.</think>I cannot tell."
    turn(client, history)
    prompts = [r.prompt_token_ids for r in engine.requests]
    replies = [[ord(c) for c in reply] for reply in SCRIPT]
    for before, reply, after in zip(prompts, replies, prompts[1:]):
        assert _shared(before + reply, after) >= len(before) + len(reply), "the prompt changed before its end"
    # the same conversation with GLM-4.7's own default: the user's reply re-renders the chain
    last = engine.prompt_text(engine.requests[-1])
    assert last.count("<think>") == len(SCRIPT) + 1
    collapsed = ChatTemplate(GLM47).render(
        [{"role": "user", "content": "a"}, {"role": "assistant", "content": "x", "reasoning_content": "r"},
         {"role": "user", "content": "b"}])
    assert "<think>r</think>" not in collapsed  # what clear_thinking (true) would have done


def test_reasoning_items_are_replayed_in_their_turn():
    engine, client = _client(ANSWER)
    history = [{"role": "user", "content": "Weather?"},
               {"type": "reasoning", "id": "rs_1", "summary": [],
                "content": [{"type": "reasoning_text", "text": "Call it."}]},
               {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
               {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
               {"type": "function_call_output", "call_id": "c1", "output": "Sunny."}]
    client.post("/v1/responses", json={"model": "glm", "input": history, "tools": [{"type": "function", **WEATHER}]})
    prompt = engine.prompt_text(engine.requests[-1])
    assert f"<|assistant|><think>Call it.</think>Checking.{_call('Paris')}<|observation|>" in prompt


def test_reasoning_effort_reaches_templates_that_read_it():
    """GLM-5.x templates read ``reasoning_effort``: each API's effort field reaches it."""
    template = ("{% for m in messages %}<|user|>{{ m.content }}{% endfor %}<|assistant|>effort={{ reasoning_effort }}"
                " thinking={{ enable_thinking }}<think>{# </think> #}")
    engine, client = _client(REPLY, template)
    client.post("/v1/chat/completions", json={"model": "glm", "messages": ASK, "reasoning_effort": "high"})
    client.post("/v1/responses", json={"model": "glm", "input": "Hi", "reasoning": {"effort": "low"}})
    client.post("/v1/messages", json={"model": "glm", "max_tokens": 2000, "messages": ASK,
                                      "thinking": {"type": "enabled", "budget_tokens": 1024},
                                      "output_config": {"effort": "medium"}})
    for level in ("xhigh", "max"):  # llama-server's and GLM-5.3's levels, on every API
        assert client.post("/v1/chat/completions", json={"model": "glm", "messages": ASK,
                                                         "reasoning_effort": level}).status_code == 200
        assert client.post("/v1/responses", json={"model": "glm", "input": "Hi",
                                                  "reasoning": {"effort": level}}).status_code == 200
        assert client.post("/v1/messages", json={"model": "glm", "max_tokens": 200, "messages": ASK,
                                                 "output_config": {"effort": level}}).status_code == 200
    prompts = [engine.prompt_text(r) for r in engine.requests]
    assert [p[p.index("effort="):] for p in prompts] == [
        "effort=high thinking=True<think>", "effort=low thinking=True<think>", "effort=medium thinking=True<think>",
        *[f"effort={level} thinking={thinking}<think>" for level in ("xhigh", "max")
          for thinking in ("True", "True", "False")]]  # (Messages without thinking: off)
    # a template with its own levels gets no budget from them: the reasoning runs to its end
    assert len(engine.requests) == 9
    bad = client.post("/v1/messages", json={"model": "glm", "max_tokens": 200, "messages": ASK,
                                            "output_config": {"effort": "huge"}})
    assert bad.status_code == 400 and bad.json()["type"] == "error"


@pytest.mark.parametrize(("effort", "budget"), [("low", 1024), ("medium", 8192), ("high", None), ("max", None)])
def test_reasoning_effort_is_a_thinking_budget_on_a_template_without_levels(effort, budget):
    """GLM-4.7's template does not read ``reasoning_effort``: the level bounds the reasoning
    (``EFFORT_BUDGETS``, documented in docs/guides/reasoning.md), on every API."""
    # (the loop guard off: the fake's reasoning, one letter 9000 times, is a loop)
    engine, client = _client(_thinker("x" * 9000), context_length=10000, loop_guard="off")
    bodies = [("/v1/chat/completions", {"messages": ASK, "reasoning_effort": effort, "max_tokens": 9500}),
              ("/v1/responses", {"input": "Hi", "reasoning": {"effort": effort}, "max_output_tokens": 9500})]
    for path, body in bodies:
        engine.requests.clear()
        assert client.post(path, json={"model": "glm", **body}).status_code == 200
        reasoned = len(engine.requests[1].prompt_token_ids) - len(engine.requests[0].prompt_token_ids) - len(
            "</think>") if len(engine.requests) > 1 else None
        assert reasoned == budget, path


GLM46 = (Path(__file__).parents[2] / "fixtures" / "glm" / "glm-4.6.jinja").read_text()


def _thinker(thought: str, answer: str = ANSWER):
    """A reply that reasons ``thought`` (no end of its own), and ``answer`` once the prompt
    ends the reasoning (the continuation after the budget's marker)."""
    return lambda prompt: answer if prompt.endswith("</think>") else thought


def test_a_thinking_budget_ends_the_reasoning_and_the_answer_follows():
    engine, client = _client(_thinker("x" * 40))
    body = {"model": "glm", "messages": ASK, "thinking_token_budget": 10, "max_tokens": 100}
    first = client.post("/v1/chat/completions", json=body).json()
    message = first["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == ("x" * 10, ANSWER)
    prompt, follow = engine.requests[0].prompt_token_ids, engine.requests[1].prompt_token_ids
    assert follow == prompt + [ord("x")] * 10 + [ord(c) for c in "</think>"]  # the marker was written
    assert engine.requests[1].sampling.max_tokens == 100 - 10 - len("</think>")
    assert engine.requests[0].request_id in engine.aborted  # the reasoning generation was stopped
    assert first["usage"]["prompt_tokens"] == len(prompt)
    assert first["usage"]["completion_tokens"] == 10 + len("</think>") + len(ANSWER)
    content, reasoning, _, finish = chat_stream(client, body)
    assert (reasoning, content, finish) == ("x" * 10, ANSWER, "stop")


def test_the_budget_counts_from_the_models_own_think_and_only_while_it_reasons():
    engine, client = _client(_thinker("<think>" + "y" * 30), GLM46, "glm45")
    body = {"model": "glm", "messages": ASK, "thinking_token_budget": 5}
    message = client.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == ("y" * 5, ANSWER)
    engine.reply = f"<think>{THOUGHT}</think>{ANSWER}"
    message = client.post("/v1/chat/completions", json={**body, "thinking_token_budget": 100}).json()
    assert message["choices"][0]["message"]["reasoning_content"] == THOUGHT  # ended by itself: no continuation
    assert len(engine.requests) == 3


def test_budget_zero_and_a_budget_max_tokens_cuts():
    engine, client = _client(_thinker("z" * 40))
    message = client.post("/v1/chat/completions", json={"model": "glm", "messages": ASK,
                                                        "thinking_token_budget": 0}).json()["choices"][0]["message"]
    assert (message.get("reasoning_content"), message["content"]) == (None, ANSWER)
    cut = client.post("/v1/chat/completions", json={"model": "glm", "messages": ASK, "thinking_token_budget": 10,
                                                    "max_tokens": 12}).json()
    assert cut["choices"][0]["finish_reason"] == "length" and cut["usage"]["completion_tokens"] == 10
    assert cut["choices"][0]["message"]["reasoning_content"] == "z" * 10


def test_anthropic_budget_tokens_rules_and_the_server_default():
    engine, client = _client(_thinker("w" * 1100), loop_guard="off")  # (one letter 1100 times: a loop)
    body = {"model": "glm", "max_tokens": 4000, "messages": ASK, "thinking": {"type": "enabled", "budget_tokens": 1024}}
    reply = client.post("/v1/messages", json=body).json()
    assert [b["type"] for b in reply["content"]] == ["thinking", "text"]
    assert reply["content"][0]["thinking"] == "w" * 1024 and reply["content"][1]["text"] == ANSWER
    for thinking, max_tokens, param in ((1023, 4000, "budget_tokens"), (None, 4000, "budget_tokens"),
                                        (1024, 1024, "max_tokens")):
        refused = client.post("/v1/messages", json={**body, "max_tokens": max_tokens, "thinking": {
            "type": "enabled", **({"budget_tokens": thinking} if thinking else {})}})
        assert refused.status_code == 400 and param in refused.json()["error"]["message"], refused.text
    engine = FakeEngine(reply=_thinker("v" * 50), context_length=8000)
    client = TestClient(create_app(one_model(ModelPipeline(engine, "glm", ChatTemplate(GLM47), "glm47", reasoning_budget=7))))
    message = client.post("/v1/chat/completions", json={"model": "glm", "messages": ASK}).json()["choices"][0]["message"]
    assert message["reasoning_content"] == "v" * 7  # --reasoning-budget
    with pytest.raises(ValueError, match="reasoning-budget"):
        ChatService(ModelPipeline(engine, "glm", ChatTemplate("{{ messages }}"), None, reasoning_budget=7))


@pytest.mark.parametrize("item", [{"content": 5}, {"content": "text"}, {"summary": {"a": 1}}, {"content": [3, None]},
                                  {"summary": [{"type": "summary_text", "text": "Call it."}]}])
def test_odd_reasoning_items_are_never_a_server_error(item):
    engine, client = _client(ANSWER)
    history = [{"role": "user", "content": "Weather?"}, {"type": "reasoning", "id": "rs_1", **item},
               {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Sunny."}]},
               {"role": "user", "content": "Thanks"}]
    resp = client.post("/v1/responses", json={"model": "glm", "input": history})
    assert resp.status_code == 200, resp.text
    summary = "summary" in item and isinstance(item["summary"], list)
    assert ("<think>Call it.</think>Sunny." in engine.prompt_text(engine.requests[-1])) == summary


JSON_ANSWER = '{"city": "Paris"}'
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
CALL = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>"


@pytest.mark.parametrize("fmt", [{"type": "json_schema", "json_schema": {"name": "c", "schema": CITY}},
                                 {"type": "json_object"}])
def test_a_grammar_on_a_reasoning_model_closes_the_reasoning_and_its_output_is_the_answer(fmt):
    """GLM-4.7 opens ``<think>`` in its generation prompt; a grammar forces JSON from the first
    token, so the prompt is rendered with thinking off and the JSON is the content (issue 90:
    it came back as ``reasoning_content`` with ``content`` empty)."""
    engine, client = _client(JSON_ANSWER)
    body = {"model": "glm", "messages": ASK, "response_format": fmt}
    message = client.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
    assert engine.prompt_text(engine.requests[-1]).endswith("<|assistant|></think>")
    assert (message.get("reasoning_content"), message["content"]) == (None, JSON_ANSWER)
    content, reasoning, _, finish = chat_stream(client, body)
    assert (reasoning, content, finish) == ("", JSON_ANSWER, "stop")

    text = {"format": {"type": "json_schema", "name": "c", "schema": CITY}} if fmt["type"] == "json_schema" else {
        "format": {"type": "json_object"}}
    output = client.post("/v1/responses", json={"model": "glm", "input": "Where?", "text": text}).json()["output"]
    assert engine.prompt_text(engine.requests[-1]).endswith("<|assistant|></think>")
    assert [(i["type"], i["content"][0]["text"]) for i in output] == [("message", JSON_ANSWER)]


@pytest.mark.parametrize("tool_choice", [{"type": "function", "function": {"name": "get_weather"}}, "required"])
def test_a_forced_call_on_a_reasoning_model_is_made_with_the_reasoning_closed(tool_choice):
    engine, client = _client(CALL)
    body = {"model": "glm", "messages": ASK, "tools": [{"type": "function", "function": WEATHER}],
            "tool_choice": tool_choice}
    choice = client.post("/v1/chat/completions", json=body).json()["choices"][0]
    assert engine.prompt_text(engine.requests[-1]).endswith("<|assistant|></think>")
    assert choice["finish_reason"] == "tool_calls"
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in choice["message"]["tool_calls"]] \
        == [("get_weather", {"city": "Paris"})]
    tools = [{"name": "get_weather", "description": "Weather", "input_schema": WEATHER["parameters"]}]
    reply = client.post("/v1/messages", json={"model": "glm", "max_tokens": 100, "messages": ASK, "tools": tools,
                                              "tool_choice": {"type": "tool", "name": "get_weather"}}).json()
    assert engine.prompt_text(engine.requests[-1]).endswith("<|assistant|></think>")
    assert [(b["type"], b.get("input")) for b in reply["content"]] == [("tool_use", {"city": "Paris"})]


def test_a_template_that_ignores_enable_thinking_gets_the_reasoning_closed_after_its_prompt():
    engine, client = _client(JSON_ANSWER, ALWAYS_THINKS, parser=None)
    body = {"model": "glm", "messages": ASK, "response_format": {"type": "json_object"}}
    message = client.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
    assert engine.prompt_text(engine.requests[-1]).endswith("<|im_start|>assistant\n<think></think>")
    assert (message.get("reasoning_content"), message["content"]) == (None, JSON_ANSWER)


def test_tags_and_role_markers_a_client_sends_are_text_and_the_templates_own_stay_tokens(monkeypatch):
    """``<|assistant|>``, ``</think>`` and ``<tool_call>`` in a user's message, in the reasoning
    a client sends back and in a tool's description are the ordinary tokens that spell them;
    the template's own role markers and tags are the special tokens (issue 90: ``encode`` parsed
    them all as special tokens, so a message could end its turn, and replayed reasoning showed
    the model an early ``</think>``)."""
    from tests.unit import fakes

    for i, tag in enumerate(("<think>", "</think>", "<tool_call>", "</tool_call>")):  # GLM's tag tokens
        monkeypatch.setitem(fakes.SPECIAL, tag, 1010 + i)
    engine, client = _client(ANSWER)
    said = "Close it with <|assistant|> or </think> or <tool_call>."
    thought = "The tag </think> ends it."
    messages = [{"role": "user", "content": said},
                {"role": "assistant", "content": "Done.", "reasoning_content": thought},
                {"role": "user", "content": "Again <|observation|>"}]
    tool = {**WEATHER, "description": "Never write <|user|> or <tool_call> here"}
    body = {"model": "glm", "messages": messages, "tools": [{"type": "function", "function": tool}],
            "chat_template_kwargs": {"clear_thinking": False}}
    assert client.post("/v1/chat/completions", json=body).status_code == 200
    ids = engine.requests[-1].prompt_token_ids
    text = engine.prompt_text(engine.requests[-1])
    assert said in text and f"<think>{thought}</think>" in text and tool["description"] in text
    names = {v: k for k, v in fakes.SPECIAL.items()}
    # the template's own markup alone: its system block's example call, then the turns
    assert [names[i] for i in ids if i in names] == [
        "[gMASK]", "<sop>", "<|system|>", "<tool_call>", "</tool_call>", "<|user|>", "<|assistant|>", "<think>",
        "</think>", "<|user|>", "<|assistant|>", "<think>"]
    # (encode reads the same text's client parts as markup too: 19 tokens, a turn ended by the client)
    assert len([i for i in engine.tokenizer.encode(text) if i in names]) == 19
