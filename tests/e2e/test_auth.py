"""``--api-key``: every route but /health needs the key; a wrong or missing key is a 401."""

from __future__ import annotations

import itertools
import json
import socket
from pathlib import Path

import httpx
import openai
import pytest

from tests.conftest import DEFAULT_MODEL, RemoteServer

KEY = "sk-test-glmserve"


@pytest.fixture(scope="module")
def keyed_server():
    srv = RemoteServer("--api-key", KEY)
    yield srv
    srv.stop()


def test_health_needs_no_key(keyed_server):
    assert httpx.get(f"{keyed_server.url}/health").status_code == 200


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}],
                         ids=["missing", "wrong", "no-bearer"])
def test_wrong_or_missing_key_is_401(keyed_server, headers):
    for method, path in [("GET", "/v1/models"), ("POST", "/v1/chat/completions"), ("GET", "/metrics"),
                         ("POST", "/tokenize"), ("POST", "/detokenize")]:
        resp = httpx.request(method, f"{keyed_server.url}{path}", headers=headers,
                             json={"model": DEFAULT_MODEL, "messages": [{"role": "user", "content": "Hi"}]})
        assert resp.status_code == 401
        error = resp.json()["error"]
        assert error["code"] == "invalid_api_key"
        assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages", "/v1/files", "/v1/batches"])
def test_a_wrong_key_is_refused_before_the_body_arrives(keyed_server, path):
    """Headers announcing a 60 MB body with a wrong key, and no body sent: the 401 comes on
    the headers alone (the server's body timeout, 30 s, is longer than the socket's here: a
    server waiting for the body fails this test), and the connection is closed."""
    host, port = keyed_server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=20) as sock:
        sock.sendall((f"POST {path} HTTP/1.1\r\nHost: {host}\r\nx-api-key: wrong\r\n"
                      "Authorization: Bearer wrong\r\nContent-Type: application/json\r\n"
                      "Content-Length: 60000000\r\n\r\n").encode())
        answer = b""
        while chunk := sock.recv(65536):  # to the close: the server closes the unread request
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.split(b"\r\n")[0] == b"HTTP/1.1 401 Unauthorized"
    assert b"connection: close" in head.lower() and b"invalid" in body


def test_right_key_works(keyed_server):
    client = keyed_server.client(api_key=KEY)
    assert client.models.list().data[0].id == DEFAULT_MODEL
    reply = client.chat.completions.create(model=DEFAULT_MODEL, messages=[{"role": "user", "content": "Hi"}],
                                           max_tokens=3)
    assert reply.usage.completion_tokens >= 1
    with pytest.raises(openai.AuthenticationError):
        keyed_server.client(api_key="nope").models.list()
    metrics = httpx.get(f"{keyed_server.url}/metrics", headers={"Authorization": f"Bearer {KEY}"})
    assert metrics.status_code == 200 and "glmserve:request_success_total" in metrics.text


def test_key_from_environment():
    srv = RemoteServer(env={"GLMSERVE_API_KEY": KEY, "GLMSERVE_SERVED_MODEL_NAME": "env-named"})
    try:
        assert httpx.get(f"{srv.url}/v1/models").status_code == 401
        assert srv.client(api_key=KEY).models.list().data[0].id == "env-named"
    finally:
        srv.stop()


def test_admin_routes_need_an_admin_key_when_there_is_one():
    """``--admin-api-key``: /metrics and the LoRA load/unload routes take only an admin key (a
    user key gets a 403), and an admin key serves every other route as well."""
    server = RemoteServer("--api-key", "user-key", "--admin-api-key", "admin-key", "--allow-runtime-lora-updating")
    try:
        def call(method: str, path: str, key: str) -> httpx.Response:
            return httpx.request(method, f"{server.url}{path}", headers={"Authorization": f"Bearer {key}"},
                                 json={"lora_name": "nope"}, timeout=60)

        for method, path in [("GET", "/metrics"), ("POST", "/v1/load_lora_adapter"),
                             ("POST", "/v1/unload_lora_adapter")]:
            refused = call(method, path, "user-key")
            assert refused.status_code == 403, (path, refused.text)
            assert refused.json()["error"]["code"] == "insufficient_permissions"
            assert call(method, path, "wrong").status_code == 401
        assert call("GET", "/metrics", "admin-key").status_code == 200
        assert call("POST", "/v1/unload_lora_adapter", "admin-key").status_code == 404  # admitted: no such adapter
        for key in ("user-key", "admin-key"):
            reply = server.client(api_key=key).chat.completions.create(
                model=DEFAULT_MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
            assert reply.choices[0].message.content is not None
    finally:
        server.stop()


def test_the_model_routes_need_an_admin_key_when_there_is_one(tmp_path):
    """A server of several models with ``--admin-api-key``: ``/models/load``, ``/models/unload``
    and ``/models/events`` answer a user key 403 and a wrong key 401, and serve an admin key."""
    from glmserve.models import default_model_path

    for name in ("alpha", "beta"):
        (tmp_path / f"{name}.gguf").symlink_to(default_model_path())
    server = RemoteServer("--models-dir", str(tmp_path), "--api-key", "user-key", "--admin-api-key", "admin-key",
                          "--max-loaded-models", "2")
    try:
        def call(method: str, path: str, key: str) -> httpx.Response:
            return httpx.request(method, f"{server.url}{path}", headers={"Authorization": f"Bearer {key}"},
                                 json={"model": "alpha"}, timeout=120)

        for method, path in [("POST", "/models/load"), ("POST", "/models/unload")]:
            refused = call(method, path, "user-key")
            assert refused.status_code == 403, (path, refused.text)
            assert refused.json()["error"]["code"] == "insufficient_permissions"
            assert call(method, path, "wrong").status_code == 401
        for key, status in (("user-key", 403), ("wrong", 401)):
            assert httpx.get(f"{server.url}/models/events", headers={"Authorization": f"Bearer {key}"},
                             timeout=30).status_code == status
        assert call("POST", "/models/load", "admin-key").json() == {"model": "alpha", "status": "loaded"}
        with httpx.stream("GET", f"{server.url}/models/events", headers={"Authorization": "Bearer admin-key"},
                          timeout=60) as events:
            assert events.status_code == 200
            first = [json.loads(line[5:]) for line in itertools.islice(
                (line for line in events.iter_lines() if line.startswith("data:")), 1)]
            assert first[0]["model"] in ("alpha", "beta", DEFAULT_MODEL)
        assert call("POST", "/models/unload", "admin-key").json() == {"model": "alpha", "status": "unloaded"}
    finally:
        server.stop()


def test_no_key_reaches_the_log_or_the_database():
    """``docs/guides/security.md``: at ``--log-level debug``, after requests with the right key
    (OpenAI's and Anthropic's headers, a stored response), a wrong one and an admin key, neither
    the server's log nor its state database holds any of them (the database: the key's SHA-256
    digest as the owner)."""
    user, admin, wrong = "sk-user-5d1c0ffee", "sk-admin-7a11beef", "sk-wrong-3e9dead"
    srv = RemoteServer("--log-level", "debug", env={"GLMSERVE_API_KEY": user, "GLMSERVE_ADMIN_API_KEY": admin})
    try:
        stored = srv.client(api_key=user).responses.create(model=DEFAULT_MODEL, input="Hi", max_output_tokens=2)
        assert srv.client(api_key=user).responses.retrieve(stored.id).id == stored.id
        reply = httpx.post(f"{srv.url}/v1/messages", headers={"x-api-key": user, "anthropic-version": "2023-06-01"},
                           json={"model": DEFAULT_MODEL, "max_tokens": 2,
                                 "messages": [{"role": "user", "content": "Hi"}]})
        assert reply.status_code == 200
        assert httpx.get(f"{srv.url}/metrics", headers={"Authorization": f"Bearer {admin}"}).status_code == 200
        assert httpx.get(f"{srv.url}/v1/models", headers={"Authorization": f"Bearer {wrong}"}).status_code == 401
        database = b"".join(path.read_bytes() for path in Path(srv._state_dir).glob("state.db*"))  # with its WAL
    finally:
        srv.stop()
    log = srv.log()
    assert "GET /v1/models" in log and "POST /v1/responses" in log  # the requests were logged
    assert stored.id.encode() in database
    for key in (user, admin, wrong):
        assert key not in log and key.encode() not in database, key
