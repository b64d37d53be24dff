"""Bad input over HTTP: an OpenAI error body with the right 4xx status, and the server unharmed."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.conftest import DEFAULT_MODEL

OK_MESSAGES = [{"role": "user", "content": "Hi"}]


def _post(server, body, **kwargs) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/chat/completions", timeout=60, **kwargs, **(
        {"content": body} if isinstance(body, (str, bytes)) else {"json": body}))


def _assert_error(resp: httpx.Response, status: int, param: str | None = "ANY", code: str | None = "ANY"):
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    if param != "ANY":
        assert error["param"] == param
    if code != "ANY":
        assert error["code"] == code
    return error


BAD_BODIES = [
    pytest.param(b"{not json", None, id="malformed-json"),
    pytest.param(b"[1, 2, 3]", None, id="body-not-object"),
    pytest.param(b'"hello"', None, id="body-string"),
    pytest.param({"model": DEFAULT_MODEL}, "messages", id="missing-messages"),
    pytest.param({"model": DEFAULT_MODEL, "messages": []}, "messages", id="empty-messages"),
    pytest.param({"messages": OK_MESSAGES}, "model", id="missing-model"),
    pytest.param({"model": DEFAULT_MODEL, "messages": [{"role": "wizard", "content": "x"}]}, "messages.0",
                 id="unknown-role"),
    pytest.param({"model": DEFAULT_MODEL, "messages": [{"role": "user", "content": 42}]}, "messages.0.content",
                 id="content-wrong-type"),
    pytest.param({"model": DEFAULT_MODEL, "messages": [{"role": "user"}]}, "messages.0.content",
                 id="content-missing"),
    pytest.param({"model": DEFAULT_MODEL, "messages": [{"role": "user", "content": [{"type": "video"}]}]},
                 "messages.0.content.0", id="unknown-part-type"),
    pytest.param({"model": DEFAULT_MODEL, "messages": "hello"}, "messages", id="messages-not-list"),
    pytest.param({"model": DEFAULT_MODEL, "messages": OK_MESSAGES, "temperature": 3}, "temperature",
                 id="temperature-high"),
    pytest.param({"model": DEFAULT_MODEL, "messages": OK_MESSAGES, "temperature": -0.1}, "temperature",
                 id="temperature-negative"),
    pytest.param({"model": DEFAULT_MODEL, "messages": OK_MESSAGES, "temperature": "hot"}, "temperature",
                 id="temperature-type"),
    pytest.param({"model": DEFAULT_MODEL, "messages": OK_MESSAGES, "top_p": 1.5}, "top_p", id="top-p-high"),
    pytest.param({"model": DEFAULT_MODEL, "messages": OK_MESSAGES, "max_tokens": 0}, "max_tokens",
                 id="max-tokens-zero"),
    pytest.param({"model": DEFAULT_MODEL, "messages": OK_MESSAGES, "max_tokens": -5}, "max_tokens",
                 id="max-tokens-negative"),
    pytest.param({"model": DEFAULT_MODEL, "messages": OK_MESSAGES, "n": 0}, "n", id="n-zero"),
    pytest.param({"model": DEFAULT_MODEL, "messages": OK_MESSAGES, "n": 9}, "n", id="n-over-max-n"),
    pytest.param({"model": DEFAULT_MODEL, "messages": OK_MESSAGES, "stop": ["a", "b", "c", "d", "e"]}, "stop",
                 id="too-many-stops"),
    pytest.param({"model": DEFAULT_MODEL, "messages": OK_MESSAGES, "stop": 5}, "stop", id="stop-wrong-type"),
    pytest.param({"model": DEFAULT_MODEL, "messages": OK_MESSAGES, "stop": "a" * 513}, "stop", id="stop-too-long"),
    pytest.param({"model": DEFAULT_MODEL, "messages": OK_MESSAGES, "stop": ["x", "a" * 513]}, "stop.1",
                 id="stop-item-too-long"),
    pytest.param({"model": DEFAULT_MODEL, "messages": OK_MESSAGES, "top_logprobs": 2}, "top_logprobs",
                 id="top-logprobs-without-logprobs"),
    pytest.param({"model": DEFAULT_MODEL, "messages": OK_MESSAGES, "top_logprobs": 21}, "top_logprobs",
                 id="top-logprobs-over-20"),
    pytest.param({"model": DEFAULT_MODEL, "messages": OK_MESSAGES, "logit_bias": {"-3": 1}}, "logit_bias",
                 id="logit-bias-not-a-token"),
    pytest.param({"model": DEFAULT_MODEL, "messages": OK_MESSAGES, "response_format": {"type": "xml"}},
                 "response_format.type", id="response-format-unknown"),
    pytest.param({"model": DEFAULT_MODEL, "messages": OK_MESSAGES, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "not": {}}}}},
                 "response_format.json_schema.schema", id="schema-feature-unsupported"),
    pytest.param({"model": DEFAULT_MODEL, "messages": OK_MESSAGES, "tools": [{"type": "retrieval"}]},
                 "tools.0.type", id="tool-not-a-function"),
    pytest.param({"model": DEFAULT_MODEL, "messages": OK_MESSAGES, "tools": [{"type": "function", "function": {}}]},
                 "tools.0.function.name", id="tool-without-name"),
    pytest.param({"model": DEFAULT_MODEL, "messages": OK_MESSAGES, "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "array"}}}]}, "tools.0.function.parameters", id="tool-schema-not-object"),
    pytest.param({"model": DEFAULT_MODEL, "messages": OK_MESSAGES, "tools": [{"type": "function", "function": {
        "name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice",
                 id="tool-choice-unknown-function"),
    pytest.param({"model": DEFAULT_MODEL, "messages": OK_MESSAGES, "tool_choice": "required"}, "tool_choice",
                 id="tool-choice-without-tools"),
    pytest.param({"model": DEFAULT_MODEL, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]},
                 "messages.0.content.0", id="image-to-text-model"),
]


@pytest.mark.parametrize(("body", "param"), BAD_BODIES)
def test_bad_request_is_400(server, body, param):
    headers = {"content-type": "application/json"}
    error = _assert_error(_post(server, body, headers=headers), 400, param)
    assert error["type"] == "invalid_request_error"


def test_unknown_model_is_404(server):
    error = _assert_error(_post(server, {"model": "gpt-4", "messages": OK_MESSAGES}), 404, "model", "model_not_found")
    assert "gpt-4" in error["message"]
    assert _assert_error(httpx.get(f"{server.url}/v1/models/gpt-4"), 404, code="model_not_found")


def test_prompt_longer_than_context(server):
    long = "hello " * 5000  # > 4096 tokens
    error = _assert_error(_post(server, {"model": DEFAULT_MODEL, "messages": [{"role": "user", "content": long}]}),
                          400, code="context_length_exceeded")
    assert "4096" in error["message"]


def test_a_prompt_longer_than_context_on_messages_in_anthropics_words(server):
    """Anthropic's 400 for a prompt over the window, the error Claude Code compacts its context on;
    streamed or not, with the prompt's length counted as for /v1/messages/count_tokens."""
    import anthropic

    client = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    messages = [{"role": "user", "content": "hello " * 5000}]
    n = client.messages.count_tokens(model=DEFAULT_MODEL, messages=messages).input_tokens
    for stream in (False, True):
        with pytest.raises(anthropic.BadRequestError) as caught:
            client.messages.create(model=DEFAULT_MODEL, max_tokens=100, messages=messages, stream=stream)
        assert caught.value.body == {"type": "error", "error": {
            "type": "invalid_request_error", "message": f"prompt is too long: {n} tokens > 4095 maximum"}}


def test_max_tokens_that_cannot_fit(server):
    body = {"model": DEFAULT_MODEL, "messages": OK_MESSAGES, "max_tokens": 4090}
    _assert_error(_post(server, body), 400, "max_tokens", "context_length_exceeded")


def test_lone_surrogate_is_400(server):
    body = '{"model": "%s", "messages": [{"role": "user", "content": "hi \\ud800 there"}]}' % DEFAULT_MODEL
    _assert_error(_post(server, body, headers={"content-type": "application/json"}), 400, "messages")


def test_deeply_nested_json_is_400(server):
    body = '{"model": "%s", "messages": %s%s}' % (DEFAULT_MODEL, "[" * 100_000, "]" * 100_000)
    _assert_error(_post(server, body, headers={"content-type": "application/json"}), 400)


def test_oversized_body_is_413():
    from tests.conftest import RemoteServer

    srv = RemoteServer("--max-request-bytes", "100000")
    try:
        big = {"model": DEFAULT_MODEL, "messages": [{"role": "user", "content": "a" * 200_000}]}
        error = _assert_error(_post(srv, big), 413, code="request_too_large")
        assert "100000" in error["message"]

        def chunked():  # no Content-Length: the limit holds while the body streams in
            yield b'{"model": "m", "messages": [{"role": "user", "content": "'
            for _ in range(50):
                yield b"a" * 10_000
            yield b'"}]}'

        resp = httpx.post(f"{srv.url}/v1/chat/completions", content=chunked(), timeout=60,
                          headers={"content-type": "application/json"})
        _assert_error(resp, 413, code="request_too_large")
        assert srv.client().chat.completions.create(model=DEFAULT_MODEL, messages=OK_MESSAGES, max_tokens=2)
    finally:
        srv.stop()


def test_unknown_route_is_openai_404(server):
    _assert_error(httpx.get(f"{server.url}/v1/nothing-here"), 404)


def test_openai_client_raises_bad_request(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=DEFAULT_MODEL, messages=OK_MESSAGES, temperature=5)
    assert info.value.status_code == 400
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=OK_MESSAGES)


def test_unknown_fields_tolerated(server):
    resp = _post(server, {"model": DEFAULT_MODEL, "messages": OK_MESSAGES, "max_tokens": 2,
                          "some_future_field": {"x": 1}, "user": "u1"})
    assert resp.status_code == 200, resp.text


def test_server_still_serves_after_bad_input(server, client):
    for body, _ in [p.values for p in BAD_BODIES]:
        _post(server, body, headers={"content-type": "application/json"})
    reply = client.chat.completions.create(model=DEFAULT_MODEL, messages=OK_MESSAGES, max_tokens=4)
    assert reply.usage.completion_tokens >= 1
