"""``/v1/messages`` (Anthropic's Messages API) end to end through Anthropic's own Python SDK
against the real server: plain and streamed replies on the default model, tool_choice any/tool
on the default model and on the hermes fixture template, a tool round trip, count_tokens,
GLM-4.5 reasoning as thinking blocks (a tiny GLM trained in the test), an image to tiny LLaVA,
Anthropic's error envelope (400, 401, 404, 413, 429, and 529 as a stream's error event at
shutdown), x-api-key, a cut stream aborted in the engine, the prefix cache over a three-turn
tool conversation, strings over 100,000 characters, a prefill continued (and chat's
``continue_final_message``), and 8 stop sequences."""

from __future__ import annotations

import json
import time

import anthropic
import httpx
import jsonschema
import openai
import pytest

from tests.conftest import DEFAULT_MODEL, RemoteServer
from tests.e2e.test_tools import TEMPLATE

SYSTEM = "You are a helpful AI assistant."
# Anthropic's SDK (2.x) has no sampling arguments of its own: they travel in the body
GREEDY = {"temperature": 0}
ASK = [{"role": "user", "content": "What is the capital of France?"}]
WEATHER = {"name": "get_weather", "description": "Current weather in a city", "input_schema": {
    "type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"]}}
TIME = {"name": "get_time", "description": "Current time in a timezone", "input_schema": {
    "type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]}}
TOOLS = [WEATHER, TIME]
SCHEMAS = {t["name"]: t["input_schema"] for t in TOOLS}
WEATHER_ASK = [{"role": "user", "content": "What is the weather like in Paris right now?"}]


def sdk(server: RemoteServer, api_key: str = "unused") -> anthropic.Anthropic:
    """Anthropic's client for ``server`` (no retries)."""
    return anthropic.Anthropic(base_url=server.url, api_key=api_key, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def messages_server():
    srv = RemoteServer("--log-level", "info", "--n-ctx", "8192")  # SmolLM2's own context: long tool results
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def hermes_server():
    srv = RemoteServer("--chat-template", str(TEMPLATE), "--tool-call-parser", "hermes")
    yield srv
    srv.stop()


def _text(message) -> str:
    return "".join(b.text for b in message.content if b.type == "text")


def test_plain_paris_with_a_system_prompt(messages_server):
    message = sdk(messages_server).messages.create(model=DEFAULT_MODEL, max_tokens=60, system=SYSTEM, messages=ASK,
                                                   extra_body=GREEDY)
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    assert message.model == DEFAULT_MODEL and "Paris" in _text(message)
    assert message.stop_reason in ("end_turn", "max_tokens") and message.stop_sequence is None
    assert message.usage.input_tokens + message.usage.cache_read_input_tokens > 0 and message.usage.output_tokens > 0


def test_stream_equals_plain_and_follows_the_event_sequence(messages_server):
    client = sdk(messages_server)
    plain = client.messages.create(model=DEFAULT_MODEL, max_tokens=60, system=SYSTEM, messages=ASK, extra_body=GREEDY)
    with client.messages.create(model=DEFAULT_MODEL, max_tokens=60, system=SYSTEM, messages=ASK, extra_body=GREEDY,
                                stream=True) as stream:
        events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    body = [k for k in kinds[1:-2] if k != "ping"]
    assert body == ["content_block_start"] + ["content_block_delta"] * (len(body) - 2) + ["content_block_stop"]
    assert "".join(e.delta.text for e in events if e.type == "content_block_delta") == _text(plain)
    assert events[-2].delta.stop_reason == plain.stop_reason
    assert events[-2].usage.output_tokens == plain.usage.output_tokens
    # the SDK's own accumulator builds the same message
    with client.messages.stream(model=DEFAULT_MODEL, max_tokens=60, system=SYSTEM, messages=ASK,
                                extra_body=GREEDY) as stream:
        final = stream.get_final_message()
    assert _text(final) == _text(plain) and final.stop_reason == plain.stop_reason


def _calls(message) -> list:
    return [b for b in message.content if b.type == "tool_use"]


@pytest.mark.parametrize("which", ["default", "hermes"])
@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "get_weather"}])
def test_tool_choice_any_and_tool_give_schema_valid_input(request, which, choice):
    server = request.getfixturevalue("messages_server" if which == "default" else "hermes_server")
    message = sdk(server).messages.create(model=DEFAULT_MODEL, max_tokens=120, system=SYSTEM, messages=WEATHER_ASK,
                                          tools=TOOLS, tool_choice=choice, extra_body=GREEDY)
    calls = _calls(message)
    assert calls and message.stop_reason == "tool_use"
    for call in calls:
        assert call.id.startswith("toolu_")
        jsonschema.validate(call.input, SCHEMAS[call.name])
    if choice["type"] == "tool":
        assert [c.name for c in calls] == ["get_weather"]
    one = sdk(server).messages.create(model=DEFAULT_MODEL, max_tokens=120, messages=WEATHER_ASK, tools=TOOLS,
                                      tool_choice={**choice, "disable_parallel_tool_use": True}, extra_body=GREEDY)
    assert len(_calls(one)) == 1


def test_tool_round_trip(hermes_server):
    """tool_use -> tool_result -> the final text, streamed tool input equal to the whole one."""
    client = sdk(hermes_server)
    kw = dict(model=DEFAULT_MODEL, max_tokens=120, system=SYSTEM, tools=[WEATHER], extra_body=GREEDY)
    first = client.messages.create(messages=WEATHER_ASK, tool_choice={"type": "tool", "name": "get_weather"}, **kw)
    (call,) = _calls(first)
    with client.messages.stream(messages=WEATHER_ASK, tool_choice={"type": "tool", "name": "get_weather"},
                                **kw) as stream:
        streamed = stream.get_final_message()
    assert [(c.name, c.input) for c in _calls(streamed)] == [(call.name, call.input)]
    history = [*WEATHER_ASK, {"role": "assistant", "content": [b.model_dump() for b in first.content]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                             "content": "Sunny, 24 degrees celsius."}]}]
    final = client.messages.create(messages=history, tool_choice={"type": "none"}, **kw)
    assert final.stop_reason in ("end_turn", "max_tokens") and _text(final).strip()
    assert not _calls(final)


def test_output_config_format_gives_schema_valid_json(messages_server):
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
              "required": ["city", "country"], "additionalProperties": False}
    message = sdk(messages_server).messages.create(
        model=DEFAULT_MODEL, max_tokens=80, messages=ASK, extra_body=GREEDY,
        output_config={"format": {"type": "json_schema", "schema": schema}})
    jsonschema.validate(json.loads(_text(message)), schema)


def test_count_tokens_equals_the_prompt_in_usage(hermes_server):
    client = sdk(hermes_server)
    kw = dict(model=DEFAULT_MODEL, system=SYSTEM, messages=WEATHER_ASK, tools=TOOLS)
    counted = client.messages.count_tokens(**kw).input_tokens
    message = client.messages.create(max_tokens=5, **kw)
    assert counted == message.usage.input_tokens + message.usage.cache_read_input_tokens
    assert counted > client.messages.count_tokens(model=DEFAULT_MODEL, messages=WEATHER_ASK).input_tokens


def test_prefix_cache_over_a_three_turn_tool_conversation(hermes_server):
    """Each turn resends the conversation: the prompt of turn N+1 extends turn N's, so all of
    turn N's prompt is read from the prefix cache (cache_read_input_tokens)."""
    client = sdk(hermes_server)
    kw = dict(model=DEFAULT_MODEL, max_tokens=60, system=SYSTEM, tools=TOOLS, extra_body=GREEDY)
    history = list(WEATHER_ASK)
    prompts, cached = [], []
    for turn in range(3):
        # tool_choice none would take the tools out of the prompt (OpenAI's "not offered"): auto last
        choice = {"type": "tool", "name": "get_weather" if turn == 0 else "get_time"} if turn < 2 else {"type": "auto"}
        message = client.messages.create(messages=history, tool_choice=choice, **kw)
        prompts.append(message.usage.input_tokens + message.usage.cache_read_input_tokens)
        cached.append(message.usage.cache_read_input_tokens)
        history.append({"role": "assistant", "content": [b.model_dump() for b in message.content]})
        results = [{"type": "tool_result", "tool_use_id": c.id, "content": "Sunny." if c.name == "get_weather"
                    else "12:00"} for c in _calls(message)]
        history.append({"role": "user", "content": results or "Thanks."})
    print(f"prompt tokens per turn {prompts}, read from the prefix cache {cached}")
    for turn in (1, 2):
        assert cached[turn] >= prompts[turn - 1], (prompts, cached)


@pytest.fixture(scope="module")
def thinker(tmp_path_factory):
    pytest.importorskip("torch")
    from tests.hf_models import tiny_glm_thinker

    folder = tiny_glm_thinker(tmp_path_factory.mktemp("glm45") / "tiny-glm45",
                                [{"role": "system", "content": SYSTEM}, *ASK], THOUGHT_REPLY)
    srv = RemoteServer("--engine", "transformers", "--model", str(folder), "--served-model-name", "tiny-glm45",
                       "--tool-call-parser", "glm45")
    yield srv
    srv.stop()


THOUGHT, ANSWER = "The user asks for the capital of France.", "Paris."
THOUGHT_REPLY = f"\n<think>{THOUGHT}</think>\n{ANSWER}"


def test_glm45_reasoning_comes_back_as_thinking_blocks(thinker):
    client = sdk(thinker)
    kw = dict(model="tiny-glm45", max_tokens=2000, system=SYSTEM, messages=ASK, extra_body=GREEDY,
              thinking={"type": "enabled", "budget_tokens": 1024})
    message = client.messages.create(**kw)
    assert [b.type for b in message.content] == ["thinking", "text"]
    assert message.content[0].thinking == THOUGHT and message.content[1].text == ANSWER
    assert message.stop_reason == "end_turn"
    with client.messages.create(stream=True, **kw) as stream:
        events = [e for e in stream if e.type != "ping"]
    starts = [e.content_block.type for e in events if e.type == "content_block_start"]
    assert starts == ["thinking", "text"]
    assert "".join(e.delta.thinking for e in events if e.type == "content_block_delta"
                   and e.delta.type == "thinking_delta") == THOUGHT
    # blocks never interleave: each start is followed by its deltas and its stop
    indices = [(e.type, e.index) for e in events if e.type.startswith("content_block")]
    assert [i for _, i in indices] == sorted(i for _, i in indices)
    # the thinking block sent back is replayed as GLM's reasoning (the count grows by its text)
    history = [*ASK, {"role": "assistant", "content": [b.model_dump() for b in message.content]},
               {"role": "user", "content": "And of Italy?"}]
    assert client.messages.count_tokens(model="tiny-glm45", messages=history).input_tokens > 0


def test_glm46_reasoning_sealed_in_encrypted_content_is_restored_in_a_tool_loop(thinker):
    """Codex's loop on GLM-4.6's template (which renders past reasoning only in the turn after
    the last user message): the reasoning of a response, sealed in ``encrypted_content`` and sent
    back before the turn's call and its output, reaches the prompt as the readable reasoning
    does; a tampered token is refused."""
    import openai

    client = openai.OpenAI(base_url=f"{thinker.url}/v1", api_key="unused", max_retries=0, timeout=120)
    first = client.responses.create(model="tiny-glm45", instructions=SYSTEM, input=ASK, max_output_tokens=80,
                                    temperature=0, store=False, include=["reasoning.encrypted_content"])
    reasoning = first.output[0]
    assert reasoning.type == "reasoning" and reasoning.content[0].text == THOUGHT
    sealed = reasoning.encrypted_content
    assert sealed and "capital" not in sealed
    call = {"type": "function_call", "call_id": "call_1", "name": "lookup", "arguments": '{"q": "France"}'}
    output = {"type": "function_call_output", "call_id": "call_1", "output": "Paris"}

    def prompt_tokens(item: dict | None) -> int:
        items = ASK + ([item] if item else []) + [call, output]
        return client.responses.create(model="tiny-glm45", instructions=SYSTEM, input=items, max_output_tokens=1,
                                       store=False).usage.input_tokens

    readable = {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": THOUGHT}]}
    with_sealed = prompt_tokens({"type": "reasoning", "summary": [], "encrypted_content": sealed})
    assert with_sealed == prompt_tokens(readable) > prompt_tokens(None)
    with pytest.raises(openai.BadRequestError, match="encrypted_content"):
        prompt_tokens({"type": "reasoning", "summary": [], "encrypted_content": sealed[:-1]})


def test_image_blocks_reach_a_vision_model(smollm2_hf, tmp_path_factory):
    pytest.importorskip("torch")
    from tests.e2e.test_vision import DATA_URL, IMAGE_TOKENS
    from tests.hf_models import tiny_llava

    llava = tiny_llava(smollm2_hf, tmp_path_factory.mktemp("vision-anthropic") / "tiny-llava")
    srv = RemoteServer("--engine", "transformers", "--model", str(llava))
    try:
        client = sdk(srv)
        data = DATA_URL.split(",", 1)[1]
        image = {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": data}}
        text = {"type": "text", "text": "What is in this picture?"}
        without = client.messages.create(model="tiny-llava", max_tokens=4, messages=[
            {"role": "user", "content": [text]}], extra_body=GREEDY)
        with_image = client.messages.create(model="tiny-llava", max_tokens=4, messages=[
            {"role": "user", "content": [image, text]}], extra_body=GREEDY)
        assert with_image.usage.input_tokens - without.usage.input_tokens == IMAGE_TOKENS
        assert with_image.usage.output_tokens > 0
        with pytest.raises(anthropic.BadRequestError) as refused:  # a URL on loopback: refused by the media policy
            client.messages.create(model="tiny-llava", max_tokens=4, messages=[{"role": "user", "content": [
                {"type": "image", "source": {"type": "url", "url": f"{srv.url}/health"}}, text]}])
        assert refused.value.body["error"]["type"] == "invalid_request_error"
    finally:
        srv.stop()


BAD_REQUESTS = [
    ("no max_tokens", {"messages": ASK}, "max_tokens"),
    ("max_tokens 0", {"messages": ASK, "max_tokens": 0}, "max_tokens"),
    ("no messages", {"messages": [], "max_tokens": 5}, "messages"),
    ("unknown role", {"messages": [{"role": "tool", "content": "x"}], "max_tokens": 5}, "role"),
    ("document block", {"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}],
                        "max_tokens": 5}, "messages.0.content.0.type"),
    ("tool_choice names no tool", {"messages": ASK, "max_tokens": 5, "tools": [WEATHER],
                                   "tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice"),
    ("temperature above 1", {"messages": ASK, "max_tokens": 5, "temperature": 1.5}, "temperature"),
    ("image to a text model", {"messages": [{"role": "user", "content": [{"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}], "max_tokens": 5}, "messages"),
    ("forced server tool", {"messages": ASK, "max_tokens": 5, "tool_choice": {"type": "tool", "name": "web_search"},
                            "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "web_search_20250305"),
    ("client tool of Anthropic's schema", {"messages": ASK, "max_tokens": 5,
                                           "tools": [{"type": "bash_20250124", "name": "bash"}]}, "tools.0.type"),
    ("33 stop sequences", {"messages": ASK, "max_tokens": 5, "stop_sequences": [f"s{i}" for i in range(33)]},
     "stop_sequences"),
    ("prefill ending in whitespace", {"messages": [*ASK, {"role": "assistant", "content": "The capital is "}],
                                      "max_tokens": 5}, "trailing whitespace"),
    ("prompt longer than the context", {"messages": [{"role": "user", "content": "hello " * 9000}],
                                        "max_tokens": 5}, "prompt is too long: "),  # Anthropic's words
]


@pytest.mark.parametrize(("case", "body", "names"), BAD_REQUESTS, ids=[c for c, _, _ in BAD_REQUESTS])
def test_bad_requests_get_anthropic_errors(messages_server, case, body, names):
    resp = httpx.post(f"{messages_server.url}/v1/messages", json={"model": DEFAULT_MODEL, **body}, timeout=60)
    assert resp.status_code == 400, resp.text
    error = resp.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert names in error["error"]["message"]
    if "max_tokens" in body:  # the SDK itself requires it: and it raises its own error type
        rest = {k: v for k, v in body.items() if k not in ("max_tokens", "messages")}
        with pytest.raises(anthropic.BadRequestError):
            sdk(messages_server).messages.create(model=DEFAULT_MODEL, max_tokens=body["max_tokens"],
                                                 messages=body["messages"], extra_body=rest)


def test_unknown_model_malformed_json_and_unknown_route(messages_server):
    with pytest.raises(anthropic.NotFoundError) as missing:
        sdk(messages_server).messages.create(model="claude-nope", max_tokens=5, messages=ASK)
    assert missing.value.body["error"]["type"] == "not_found_error"
    resp = httpx.post(f"{messages_server.url}/v1/messages", content=b"{not json", timeout=30,
                      headers={"content-type": "application/json"})
    assert resp.status_code == 400 and resp.json()["error"]["type"] == "invalid_request_error"
    resp = httpx.post(f"{messages_server.url}/v1/messages/nowhere", json={}, timeout=30)
    assert resp.status_code == 404 and resp.json()["error"]["type"] == "not_found_error"
    assert httpx.get(f"{messages_server.url}/health").status_code == 200


def test_x_api_key():
    srv = RemoteServer("--api-key", "sekret")
    try:
        with pytest.raises(anthropic.AuthenticationError) as denied:
            sdk(srv, api_key="wrong").messages.create(model=DEFAULT_MODEL, max_tokens=5, messages=ASK)
        assert denied.value.status_code == 401 and denied.value.body["error"]["type"] == "authentication_error"
        resp = httpx.post(f"{srv.url}/v1/messages", json={"model": DEFAULT_MODEL, "max_tokens": 5, "messages": ASK})
        assert resp.status_code == 401 and resp.json()["type"] == "error"
        ok = sdk(srv, api_key="sekret").messages.create(model=DEFAULT_MODEL, max_tokens=5, messages=ASK)
        assert ok.usage.output_tokens > 0
        assert sdk(srv, api_key="sekret").messages.count_tokens(model=DEFAULT_MODEL, messages=ASK).input_tokens > 0
    finally:
        srv.stop()


def test_a_cut_stream_is_aborted_in_the_engine(messages_server):
    long = [{"role": "user", "content": "Write a very long story about a dragon, in many chapters."}]
    before = messages_server.log().count("aborted after")
    with httpx.stream("POST", f"{messages_server.url}/v1/messages", timeout=60, json={
            "model": DEFAULT_MODEL, "max_tokens": 2000, "messages": long, "stream": True,
            "stop_sequences": ["\u2603"]}) as resp:  # a stop sequence the model will not write
        assert resp.status_code == 200
        deltas = 0
        for line in resp.iter_lines():
            deltas += line.startswith("data: ") and '"text_delta"' in line
            if deltas >= 5:
                break  # leave: the connection closes
    deadline = time.monotonic() + 60
    while (log := messages_server.log()).count("aborted after") <= before:
        assert time.monotonic() < deadline, log[-2000:]
        time.sleep(0.2)
    aborted_after = int(log.rsplit("aborted after ", 1)[1].split()[0])
    assert aborted_after < 2000
    again = sdk(messages_server).messages.create(model=DEFAULT_MODEL, max_tokens=3, messages=ASK)
    assert again.usage.output_tokens >= 1


def test_thinking_and_beta_fields_claude_code_sends_are_accepted(messages_server):
    """Claude Code's body (shared/reference/anthropic/CLAUDE-CODE.md): system blocks with
    cache_control, a mid-conversation system turn, thinking adaptive, output_config,
    context_management, metadata.user_id, max_tokens 32000 (a ceiling), a query string."""
    body = {"model": DEFAULT_MODEL, "max_tokens": 32000, "temperature": 0,
            "system": [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi."}, {
                "type": "text", "text": "What is the capital of France?", "cache_control": {"type": "ephemeral"}}]},
                {"role": "system", "content": "Answer in one word."}],
            "thinking": {"type": "adaptive"}, "output_config": {"effort": "high"},
            "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
            "metadata": {"user_id": json.dumps({"device_id": "x", "session_id": "y"})}}
    headers = {"anthropic-version": "2023-06-01", "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14",
               "x-app": "cli", "x-api-key": "unused"}
    resp = httpx.post(f"{messages_server.url}/v1/messages?beta=true", json=body, headers=headers, timeout=120)
    assert resp.status_code == 200, resp.text
    assert resp.json()["stop_reason"] in ("end_turn", "max_tokens")


class _AnyText:
    def __eq__(self, other):
        return isinstance(other, str) and bool(other)


ANY_TEXT = _AnyText()


def test_too_large_overload_and_shutdown_in_anthropic_shapes():
    """413 ``request_too_large``; 429 ``rate_limit_error`` with ``retry-after`` while the only
    sequence is busy (``--max-queue 0``); a stream running at SIGTERM ends with an ``error``
    event ``overloaded_error`` (the 503 of the OpenAI routes) and the server exits 0."""
    import signal

    srv = RemoteServer("--max-num-seqs", "1", "--max-queue", "0", "--max-request-bytes", "100000",
                       "--shutdown-timeout", "2")
    try:
        url = f"{srv.url}/v1/messages"
        big = httpx.post(url, json={"model": DEFAULT_MODEL, "max_tokens": 5,
                                    "messages": [{"role": "user", "content": "a" * 200_000}]}, timeout=60)
        assert big.status_code == 413
        assert big.json() == {"type": "error", "error": {"type": "request_too_large", "message": ANY_TEXT}}
        story = {"model": DEFAULT_MODEL, "max_tokens": 2000, "temperature": 0, "stream": True,
                 "messages": [{"role": "user", "content": "Write a very long story about a dragon, in many chapters."}]}
        with httpx.stream("POST", url, json=story, timeout=60) as resp:
            lines = resp.iter_lines()
            for line in lines:
                if '"text_delta"' in line:
                    break  # the only sequence is now busy
            busy = httpx.post(url, json={"model": DEFAULT_MODEL, "max_tokens": 3, "messages": ASK}, timeout=60)
            assert busy.status_code == 429, busy.text
            assert int(busy.headers["retry-after"]) >= 1
            assert busy.json()["error"]["type"] == "rate_limit_error"
            srv.proc.send_signal(signal.SIGTERM)
            rest = [line for line in lines if line]  # ends within the shutdown timeout
        assert srv.proc.wait(timeout=60) == 0
        assert rest[-2] == "event: error" and rest[-1].startswith("data: "), rest[-4:]
        error = json.loads(rest[-1][len("data: "):])
        assert error["type"] == "error" and error["error"]["type"] == "overloaded_error"
    finally:
        srv.stop()



def test_strings_longer_than_100000_characters(messages_server):
    """A string ``system`` or ``content`` has no length bound of its own (only the body's and the
    context's): counted with all three 100,001 characters long (``MessagesRequest`` is
    ``CountTokensRequest`` with ``max_tokens``), and answered where a Claude Code session reads a
    long file, a tool result of 100,001 dashes (1,563 SmolLM2 tokens; the three long together
    took 24 s to prefill here)."""
    read = {"name": "read_file", "description": "Read a file", "input_schema": {
        "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}
    conversation = dict(system="-" * 100_001, tools=[read], messages=[
        {"role": "user", "content": "=" * 100_001},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "read_file",
                                           "input": {"path": "rule.txt"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "-" * 100_001}]}])
    client = sdk(messages_server)
    assert client.messages.count_tokens(model=DEFAULT_MODEL, **conversation).input_tokens > 3 * 1562
    long_file = {**conversation, "system": "You are a helpful AI assistant.",
                 "messages": [{"role": "user", "content": "Read rule.txt."}, *conversation["messages"][1:]]}
    counted = client.messages.count_tokens(model=DEFAULT_MODEL, **long_file).input_tokens
    assert counted > 1562
    reply = client.messages.create(model=DEFAULT_MODEL, max_tokens=4, extra_body=GREEDY, **long_file)
    assert reply.usage.input_tokens + reply.usage.cache_read_input_tokens == counted


def test_a_final_assistant_message_is_continued(messages_server):
    """A prefill: the reply continues the assistant's text (Anthropic's API), and chat's
    ``continue_final_message`` (vLLM's) gives the same continuation."""
    prefill = "The capital of France is"
    reply = sdk(messages_server).messages.create(model=DEFAULT_MODEL, max_tokens=8, extra_body=GREEDY,
                                                 messages=[*ASK, {"role": "assistant", "content": prefill}])
    text = _text(reply)
    assert "Paris" in text and "capital" not in text  # the continuation alone, not a fresh answer
    chat = messages_server.client().chat.completions.create(
        model=DEFAULT_MODEL, max_tokens=8, temperature=0, messages=[*ASK, {"role": "assistant", "content": prefill}],
        extra_body={"continue_final_message": True, "add_generation_prompt": False})
    assert chat.choices[0].message.content == text
    fresh = messages_server.client().chat.completions.create(
        model=DEFAULT_MODEL, max_tokens=8, temperature=0, messages=[*ASK, {"role": "assistant", "content": prefill}])
    assert fresh.choices[0].message.content != text  # without it, a new assistant turn starts
    with pytest.raises(openai.BadRequestError, match="continue_final_message"):
        messages_server.client().chat.completions.create(model=DEFAULT_MODEL, max_tokens=8, messages=ASK,
                                                         extra_body={"continue_final_message": True})


def test_eight_stop_sequences(messages_server):
    stops = ["zebra", "quartz", "Paris", "violin", "comet", "walnut", "harbor", "meadow"]
    reply = sdk(messages_server).messages.create(model=DEFAULT_MODEL, max_tokens=60, system=SYSTEM, messages=ASK,
                                                 stop_sequences=stops, extra_body=GREEDY)
    assert (reply.stop_reason, reply.stop_sequence) == ("stop_sequence", "Paris")
    assert "Paris" not in _text(reply)
