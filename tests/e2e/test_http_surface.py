"""The HTTP surface around the API: docs behind the key, 405 with ``Allow``, ``x-request-id``,
CORS, the OpenAPI contract, ``--n-ctx`` honoured exactly."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import DEFAULT_MODEL, RemoteServer

HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def keyed():
    server = RemoteServer("--api-key", "sk-test", "--allowed-origins", "http://app.example")
    yield server
    server.stop()


@pytest.mark.parametrize("path", ["/openapi.json", "/docs", "/redoc"])
def test_docs_and_spec_need_the_key(keyed, path):
    resp = httpx.get(f"{keyed.url}{path}")
    assert resp.status_code in (401, 404), resp.text[:200]
    assert "paths" not in resp.text


def test_spec_with_the_key(keyed):
    resp = httpx.get(f"{keyed.url}/openapi.json", headers={"Authorization": "Bearer sk-test"})
    assert resp.status_code == 200
    assert "/v1/chat/completions" in resp.json()["paths"]


def test_docs_without_a_key(server):
    assert httpx.get(f"{server.url}/docs").status_code == 200
    assert httpx.get(f"{server.url}/openapi.json").status_code == 200


def test_405_keeps_allow(server):
    resp = httpx.delete(f"{server.url}/v1/chat/completions")
    assert resp.status_code == 405
    assert resp.headers["allow"] == "POST"
    assert resp.json()["error"]["type"] == "invalid_request_error"


def test_request_id_made_and_echoed(server, client):
    made = httpx.get(f"{server.url}/v1/models").headers["x-request-id"]
    assert made.startswith("req_") and len(made) > 10
    assert httpx.get(f"{server.url}/v1/models").headers["x-request-id"] != made
    echoed = httpx.get(f"{server.url}/v1/models", headers={"X-Request-Id": "my-trace-42"})
    assert echoed.headers["x-request-id"] == "my-trace-42"
    insane = httpx.get(f"{server.url}/v1/models", headers={"X-Request-Id": "x" * 500})
    assert insane.headers["x-request-id"].startswith("req_")
    for resp in (httpx.get(f"{server.url}/nothing"), httpx.get(f"{server.url}/health"),
                 httpx.post(f"{server.url}/v1/chat/completions", content=b"{")):
        assert resp.headers["x-request-id"].startswith("req_")
    reply = client.chat.completions.with_raw_response.create(model=DEFAULT_MODEL, messages=HI, max_tokens=2)
    assert reply.headers["x-request-id"].startswith("req_")
    assert reply.parse()._request_id == reply.headers["x-request-id"]


def test_request_id_on_streams(server):
    body = {"model": DEFAULT_MODEL, "messages": HI, "max_tokens": 2, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=60,
                      headers={"X-Request-Id": "stream-7"}) as resp:
        assert resp.headers["x-request-id"] == "stream-7"
        assert "[DONE]" in resp.read().decode()


def test_the_log_names_each_request_by_its_id(server, client):
    """A failure a client reports is found in the log by the id its response carried: the
    access line of each request ends with its ``x-request-id`` (given or made), streamed too."""
    refused = httpx.post(f"{server.url}/v1/chat/completions", json={"model": DEFAULT_MODEL, "messages": []},
                         headers={"X-Request-Id": "log-trace-1"})
    assert refused.status_code == 400
    made = client.chat.completions.with_raw_response.create(model=DEFAULT_MODEL, messages=HI, max_tokens=2)
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", timeout=60, headers={"X-Request-Id": "log-trace-2"},
                      json={"model": DEFAULT_MODEL, "messages": HI, "max_tokens": 2, "stream": True}) as resp:
        resp.read()
    lines = server.log().splitlines()
    for request_id, status in (("log-trace-1", 400), (made.headers["x-request-id"], 200), ("log-trace-2", 200)):
        assert any(line.endswith(f" {request_id}") and f'"POST /v1/chat/completions HTTP/1.1" {status}' in line
                   for line in lines), (request_id, lines[-20:])


def test_cors(keyed):
    preflight = httpx.options(f"{keyed.url}/v1/chat/completions", headers={
        "Origin": "http://app.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == "http://app.example"
    assert "POST" in preflight.headers["access-control-allow-methods"]
    resp = httpx.get(f"{keyed.url}/v1/models", headers={"Origin": "http://app.example",
                                                        "Authorization": "Bearer sk-test"})
    assert resp.headers["access-control-allow-origin"] == "http://app.example"
    assert "x-request-id" in resp.headers["access-control-expose-headers"]
    other = httpx.get(f"{keyed.url}/v1/models", headers={"Origin": "http://evil.example",
                                                         "Authorization": "Bearer sk-test"})
    assert "access-control-allow-origin" not in other.headers


def test_no_cors_by_default(server):
    resp = httpx.get(f"{server.url}/v1/models", headers={"Origin": "http://app.example"})
    assert "access-control-allow-origin" not in resp.headers


def test_openapi_declares_what_is_sent(server):
    spec = httpx.get(f"{server.url}/openapi.json").json()
    chat = spec["paths"]["/v1/chat/completions"]["post"]["responses"]
    assert "422" not in chat
    assert {"200", "400", "401", "404", "408", "413", "429", "500"} <= set(chat)
    assert chat["400"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorResponse")
    assert "text/event-stream" in chat["200"]["content"]
    assert "401" in spec["paths"]["/v1/models"]["get"]["responses"]
    assert "404" in spec["paths"]["/v1/models/{model_id}"]["get"]["responses"]
    for path in spec["paths"].values():
        for operation in path.values():
            assert "422" not in operation["responses"]


def test_n_ctx_is_what_was_asked():
    srv = RemoteServer("--n-ctx", "128")
    try:
        card = httpx.get(f"{srv.url}/v1/models").json()["data"][0]
        assert card["max_model_len"] == 128
        resp = httpx.post(f"{srv.url}/v1/chat/completions", timeout=60,
                          json={"model": DEFAULT_MODEL, "messages": [{"role": "user", "content": "word " * 150}]})
        assert resp.status_code == 400
        assert resp.json()["error"]["code"] == "context_length_exceeded"
        assert "128" in resp.json()["error"]["message"]
    finally:
        srv.stop()
