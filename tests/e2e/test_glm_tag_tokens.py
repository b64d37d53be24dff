"""GLM's tags are read by token, and malformed calls as meant (issue 75), on every engine.

A tiny GLM with GLM-4.7's template (its generation prompt opens the reasoning) is trained here to
write these replies, each ending its turn as GLM does: a ``write_file`` call whose content holds
a literal ``</arg_value>`` spelled by ordinary tokens; an answer quoting an offered tool's call
``<tool_call>get_weather</tool_call>`` in ordinary tokens; reasoning that mentions ``</think>``
in ordinary tokens; calls missing their ``</arg_value>`` (about 5% of GLM-4.7's production
traces, vLLM issue 49248), ``</arg_key>``, first ``<arg_key>`` or ``</tool_call>``; JSON
arguments inside the tags (GLM-4-0414's form); and a call written inside the reasoning. Where the tokenizer holds the tags as tokens, only those tokens are
tags: the spelled ones are text, in arguments, content and reasoning.

And a four-turn tool conversation, the reasoning of each turn passed back: no turn's reasoning
reaches its content. Served four ways: a converter-made GGUF whose tags are control tokens (``special``), one whose
tags are ordinary added tokens (``text``: user-defined in the GGUF), and the transformers and
vLLM engines on the folder. Chat completions plain and streamed give the same calls, content and
reasoning; Messages and Responses give them in their shapes; ``/v1/completions`` writes the
tags as the model wrote them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anthropic
import openai
import pytest

from tests.conftest import RemoteServer, vllm_server

MODEL = "tiny-glm-tags"
S = "\x00"  # tests/hf_models.py SPELLED: the text between two is written by ordinary tokens
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}
WRITE = {"type": "function", "function": {"name": "write_file", "description": "Write a file", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}}}}}
TOOLS = [WEATHER, WRITE]


def _ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


# (prompt, reply as trained, end token, what every API must give back: reasoning, content, calls)
CASES = {
    "spelled-tag-in-an-argument": (
        _ask("Write the note."),
        f"Writing.</think><tool_call>write_file<arg_key>path</arg_key><arg_value>n.md</arg_value><arg_key>content"
        f"</arg_key><arg_value>x{S}</arg_value>{S}y</arg_value></tool_call>", "<|observation|>",
        ("Writing.", None, [("write_file", {"path": "n.md", "content": "x</arg_value>y"})])),
    "quoted-call-in-an-answer": (
        _ask("How is it called?"),
        f"Quote it.</think>Use {S}<tool_call>get_weather</tool_call>{S} to call.", "<|user|>",
        ("Quote it.", "Use <tool_call>get_weather</tool_call> to call.", [])),
    "spelled-end-of-reasoning": (
        _ask("Name the tag."),
        f"The tag {S}</think>{S} ends it.</think>Done.", "<|user|>",
        ("The tag </think> ends it.", "Done.", [])),
    "missing-arg-value-end": (
        _ask("Weather in Rome?"),
        "Look.</think><tool_call>get_weather<arg_key>city</arg_key><arg_value>Rome</tool_call>", "<|observation|>",
        ("Look.", None, [("get_weather", {"city": "Rome"})])),
    "missing-arg-key-end": (
        _ask("Weather in Oslo?"),
        "Look.</think><tool_call>get_weather<arg_key>city<arg_value>Oslo</arg_value></tool_call>", "<|observation|>",
        ("Look.", None, [("get_weather", {"city": "Oslo"})])),
    "missing-first-arg-key": (
        _ask("Weather in Bonn?"),
        "Look.</think><tool_call>get_weather\ncity</arg_key><arg_value>Bonn</arg_value></tool_call>", "<|observation|>",
        ("Look.", None, [("get_weather", {"city": "Bonn"})])),
    "missing-call-end": (
        _ask("Weather in Nice?"),
        "Look.</think><tool_call>get_weather<arg_key>city</arg_key><arg_value>Nice</arg_value>", "<|observation|>",
        ("Look.", None, [("get_weather", {"city": "Nice"})])),
    "json-arguments-in-the-tags": (
        _ask("Weather in Lima?"),
        'Look.</think><tool_call>get_weather\n{"city": "Lima"}</tool_call>', "<|observation|>",
        ("Look.", None, [("get_weather", {"city": "Lima"})])),
    "call-inside-the-reasoning": (  # GLM-5.2 does this (vLLM changed its parsers for it)
        _ask("Weather in Kyiv?"),
        "I will check.<tool_call>get_weather<arg_key>city</arg_key><arg_value>Kyiv</arg_value></tool_call>",
        "<|observation|>", ("I will check.", None, [("get_weather", {"city": "Kyiv"})])),
}

def _call(city: str, i: int) -> dict:
    return {"role": "assistant", "content": None, "reasoning_content": "Look.", "tool_calls": [
        {"id": f"call_{i}", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}]}


# a four-turn agent conversation, each reasoning passed back as chat completions return it: the
# request before each turn, the reply as trained, its end token, and what must come back
Q1, Q2 = _ask("Weather in Paris?"), [{"role": "user", "content": "And Oslo?"}]
T1 = [*Q1, _call("Paris", 1), {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"}]
T2 = [*T1, {"role": "assistant", "content": "Sunny in Paris.", "reasoning_content": "Got it."}, *Q2]
T3 = [*T2, _call("Oslo", 2), {"role": "tool", "tool_call_id": "call_2", "content": "Rain"}]
TURNS = [
    (Q1, "Look.</think><tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>",
     "<|observation|>", ("Look.", None, [("get_weather", {"city": "Paris"})])),
    (T1, "Got it.</think>Sunny in Paris.", "<|user|>", ("Got it.", "Sunny in Paris.", [])),
    (T2, "Look.</think><tool_call>get_weather<arg_key>city</arg_key><arg_value>Oslo</arg_value></tool_call>",
     "<|observation|>", ("Look.", None, [("get_weather", {"city": "Oslo"})])),
    (T3, "Wet.</think>Rain in Oslo.", "<|user|>", ("Wet.", "Rain in Oslo.", [])),
]

# thinking off (GLM-4.7's prompt then ends ``<|assistant|></think>``), a model that reasons anyway,
# opening <think> itself or not (issue 90, 7: the reasoning and the tag came back as the answer)
THINKING_OFF, REASONS_ANYWAY = _ask("Is it late?"), "<think>Check the clock.</think>Not yet."
SUM, SUM_REASONED = _ask("What is two plus two?"), "Two plus two makes four.</think>The answer is 4."
REASONED_OFF = {"opens-think": (THINKING_OFF, "Check the clock.", "Not yet."),
                "no-think": (SUM, "Two plus two makes four.", "The answer is 4.")}

# what a grammar forces (JSON, a forced call) is the answer: trained, as GLM-4.7 is, to answer these
# at once with thinking off, and to reason first with it on (issue 90: the JSON came back as reasoning,
# the forced call's arguments as garbage, written where the model reasons)
WHERE, WHERE_JSON = _ask("Where is the Louvre?"), '{"city": "Paris"}'
LOUVRE = _ask("Weather at the Louvre?")
LOUVRE_CALL = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>"
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def _template_messages(messages: list[dict]) -> list[dict]:
    """``messages`` as glmserve hands them to the chat template (``chat/messages.py``): a call's
    arguments as an object, no ``content`` as empty text."""
    out = []
    for m in messages:
        m = dict(m, content=m["content"] or "")
        if "tool_calls" in m:
            m["tool_calls"] = [{**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
                               for c in m["tool_calls"]]
        out.append(m)
    return out


SERVED = ["gguf-special", "gguf-text", "transformers", "vllm"]


class Served:
    def __init__(self, server: RemoteServer, folder: Path) -> None:
        self.server, self.folder = server, folder
        self.openai = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)
        self.anthropic = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module", params=SERVED)
def served(request, tmp_path_factory):
    pytest.importorskip("torch")
    from tests.gguf_cache import converted_gguf
    from tests.hf_models import tiny_glm_trained

    tags = "text" if request.param == "gguf-text" else "special"
    replies = [(_template_messages(messages), {"tools": TOOLS}, reply, end)
               for messages, reply, end, _ in [*CASES.values(), *TURNS]]
    replies.append((THINKING_OFF, {"tools": TOOLS, "enable_thinking": False}, REASONS_ANYWAY, "<|user|>"))
    replies.append((SUM, {"tools": TOOLS, "enable_thinking": False}, SUM_REASONED, "<|user|>"))
    replies += [(WHERE, {"enable_thinking": False}, WHERE_JSON, "<|user|>"),
                (WHERE, {}, "Think of Paris.</think>In Paris.", "<|user|>"),
                (LOUVRE, {"tools": TOOLS, "enable_thinking": False}, LOUVRE_CALL, "<|observation|>"),
                (LOUVRE, {"tools": TOOLS}, "Think of Paris.</think>It is in Paris.", "<|user|>")]
    root = tmp_path_factory.mktemp(request.param)
    folder = tiny_glm_trained(root / MODEL, "Glm4ForCausalLM", "glm-4.7.jinja", replies, steps=1500, tags=tags)
    if request.param == "vllm":
        server = vllm_server(folder, "--served-model-name", MODEL, "--n-ctx", "2048")
        yield Served(server, folder)
        server.stop()
        return
    if request.param == "transformers":
        args = ("--engine", "transformers", "--model", str(folder))
    else:
        converter = Path(sys.prefix) / "share" / "llama.cpp" / "convert_hf_to_gguf.py"
        args = ("--model", str(converted_gguf(folder, root / f"{MODEL}.gguf", converter, tokenizer_pre="glm4")),
                "--n-ctx", "2048")
    server = RemoteServer(*args, "--served-model-name", MODEL)
    yield Served(server, folder)
    server.stop()


@pytest.mark.parametrize("case", list(CASES))
def test_chat_completions_plain_and_streamed(served, case):
    messages, _, _, expected = CASES[case]
    _chat(served, messages, expected)


def test_a_four_turn_tool_conversation_keeps_reasoning_out_of_the_content(served):
    """Each turn's request holds the earlier turns as a client sends them back (reasoning as
    ``reasoning_content``, calls, tool results): every turn's reasoning is reasoning, its answer
    the answer alone (vLLM issue 27703: reasoning in the content from the third turn)."""
    for messages, _, _, expected in TURNS:
        _chat(served, messages, expected)


def _chat(served: Served, messages: list[dict], expected: tuple) -> None:
    reasoning, content, calls = expected
    kw = dict(model=MODEL, messages=messages, tools=TOOLS, temperature=0, max_tokens=200)
    choice = served.openai.chat.completions.create(**kw).choices[0]
    message = choice.message
    got = [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]
    assert ((message.model_extra or {}).get("reasoning_content"), message.content, got) == (reasoning, content, calls)
    assert choice.finish_reason == ("tool_calls" if calls else "stop")
    streamed_reasoning, streamed_content, arguments, names = "", "", {}, {}
    for chunk in served.openai.chat.completions.create(**kw, stream=True):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        streamed_reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
        streamed_content += delta.content or ""
        for call in delta.tool_calls or []:
            names[call.index] = names.get(call.index, "") + (call.function.name or "")
            arguments[call.index] = arguments.get(call.index, "") + (call.function.arguments or "")
    streamed_calls = [(names[i], json.loads(arguments[i])) for i in sorted(names)]
    assert (streamed_reasoning or None, streamed_content or None, streamed_calls) == (reasoning, content, calls)


@pytest.mark.parametrize("case", list(CASES))
def test_messages_and_responses_give_the_same(served, case):
    messages, _, _, (reasoning, content, calls) = CASES[case]
    tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
              "input_schema": t["function"]["parameters"]} for t in TOOLS]
    message = served.anthropic.messages.create(model=MODEL, max_tokens=2000, messages=messages, tools=tools,
                                               thinking={"type": "enabled", "budget_tokens": 1024},
                                               extra_body={"temperature": 0})
    blocks = [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None) or (b.name, b.input))
              for b in message.content]
    assert blocks == ([("thinking", reasoning)] + ([("text", content)] if content else [])
                      + [("tool_use", call) for call in calls])
    response = served.openai.responses.create(model=MODEL, input=messages, temperature=0, max_output_tokens=200,
                                              tools=[{"type": "function", **t["function"]} for t in TOOLS])
    assert [item.content[0].text for item in response.output if item.type == "reasoning"] == [reasoning]
    assert (response.output_text or None) == content
    assert [(item.name, json.loads(item.arguments)) for item in response.output if item.type == "function_call"] == calls


@pytest.mark.parametrize("case", list(REASONED_OFF))
def test_thinking_off_a_model_that_reasons_anyway_answers_alone(served, case):
    """With thinking off, reasoning the model writes anyway (``<think>`` opened or not, then
    ``</think>``) is reasoning on chat completions, and dropped by the Messages API without
    ``thinking`` (Anthropic's default), whole and streamed: the text is the answer alone, on
    every engine."""
    messages, reasoning, answer = REASONED_OFF[case]
    tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
              "input_schema": t["function"]["parameters"]} for t in TOOLS]
    kwargs = dict(model=MODEL, max_tokens=200, messages=messages, tools=tools, extra_body={"temperature": 0})
    message = served.anthropic.messages.create(**kwargs)
    assert [(b.type, b.text) for b in message.content] == [("text", answer)]
    with served.anthropic.messages.stream(**kwargs) as stream:
        assert [(b.type, b.text) for b in stream.get_final_message().content] == [("text", answer)]
    reply = served.openai.chat.completions.create(
        model=MODEL, messages=messages, tools=TOOLS, temperature=0, max_tokens=200,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}}).choices[0].message
    assert ((reply.model_extra or {}).get("reasoning_content"), reply.content) == (reasoning, answer)


def test_completions_write_the_tags_as_the_model_wrote_them(served):
    """The rendered prompt of the first case on ``/v1/completions``: its text begins with the
    reply, tag tokens and spelled tags alike (the completions API stops at the model's end of
    generation only, which ``<|observation|>`` need not be)."""
    from transformers import AutoTokenizer

    messages, reply, _, _ = CASES["spelled-tag-in-an-argument"]
    tokenizer = AutoTokenizer.from_pretrained(served.folder)
    prompt = tokenizer.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    text = served.openai.completions.create(model=MODEL, prompt=prompt, temperature=0, max_tokens=200).choices[0].text
    assert text.startswith(reply.replace(S, "")), text


def test_the_json_a_grammar_forces_is_the_answer(served):
    """JSON (``json_schema`` plain and streamed, ``json_object``, Responses ``text.format``) is
    the content: the prompt closes the reasoning the model would otherwise open, on every engine."""
    kw = dict(model=MODEL, messages=WHERE, temperature=0, max_tokens=60)
    schema = {"type": "json_schema", "json_schema": {"name": "place", "schema": CITY}}
    for fmt in (schema, {"type": "json_object"}):
        message = served.openai.chat.completions.create(**kw, response_format=fmt).choices[0].message
        assert ((message.model_extra or {}).get("reasoning_content"), message.content) == (None, WHERE_JSON)
    streamed = [c.choices[0].delta for c in served.openai.chat.completions.create(**kw, response_format=schema,
                                                                                  stream=True) if c.choices]
    assert "".join(d.content or "" for d in streamed) == WHERE_JSON
    assert not any((d.model_extra or {}).get("reasoning_content") for d in streamed)
    response = served.openai.responses.create(model=MODEL, input=WHERE, temperature=0, max_output_tokens=60,
                                              text={"format": {"type": "json_schema", "name": "place", "schema": CITY}})
    assert [item.type for item in response.output] == ["message"]
    assert response.output_text == WHERE_JSON


def test_a_forced_call_is_written_where_the_model_answers(served):
    """A forced call (named, ``required``, Messages ``tool_choice`` ``tool``) is a call with the
    arguments the model writes unforced, not where it was trained to reason."""
    for choice in ({"type": "function", "function": {"name": "get_weather"}}, "required"):
        reply = served.openai.chat.completions.create(model=MODEL, messages=LOUVRE, tools=TOOLS, tool_choice=choice,
                                                      temperature=0, max_tokens=60).choices[0]
        assert reply.finish_reason == "tool_calls"
        assert [(c.function.name, json.loads(c.function.arguments)) for c in reply.message.tool_calls] == [
            ("get_weather", {"city": "Paris"})]
    tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
              "input_schema": t["function"]["parameters"]} for t in TOOLS]
    message = served.anthropic.messages.create(model=MODEL, max_tokens=60, messages=LOUVRE, tools=tools,
                                               tool_choice={"type": "tool", "name": "get_weather"},
                                               extra_body={"temperature": 0})
    assert [(b.type, getattr(b, "name", None), getattr(b, "input", None)) for b in message.content] == [
        ("tool_use", "get_weather", {"city": "Paris"})]


def test_tags_and_role_markers_in_the_messages_are_text(served):
    """A ``<|assistant|>``, ``</think>``, ``<tool_call>`` or ``<|observation|>`` a client writes
    in a message, or sends back in the reasoning, is tokenized as the ordinary tokens that spell
    it; the template's own are the tokens (issue 90: a message could end its turn, and replayed
    reasoning showed the model an early ``</think>``), on every engine's tokenizer."""
    import httpx
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(served.folder)
    said, thought = "Close it with <|assistant|> or </think> or <tool_call>.", "The tag </think> ends it."

    def conversation(said: str, thought: str, again: str) -> list[dict]:
        return [{"role": "user", "content": said},
                {"role": "assistant", "content": "Done.", "reasoning_content": thought},
                {"role": "user", "content": again}]

    body = {"model": MODEL, "messages": conversation(said, thought, "Again <|observation|>"), "tools": TOOLS}
    ids = httpx.post(f"{served.server.url}/tokenize", json=body, timeout=60).json()["tokens"]
    marks = {tokenizer.convert_tokens_to_ids(t): t for t in
             ("<|assistant|>", "<|observation|>", "<|user|>", "<think>", "</think>", "<tool_call>")}
    plain = tokenizer.apply_chat_template(conversation("Close it.", "The tag ends it.", "Again"), tools=TOOLS,
                                          add_generation_prompt=True, tokenize=False)
    expected = [marks[i] for i in tokenizer.encode(plain, add_special_tokens=False) if i in marks]
    assert [marks[i] for i in ids if i in marks] == expected
    assert said in tokenizer.decode(ids)
