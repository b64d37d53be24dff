"""A request's key is checked on its headers, before any of its body is read (issue 91, 1):
headers announcing a 60 MB body with a wrong key get their 401 (or an admin route's 403) in
the route's dialect at once, where FastAPI would read and parse the body (or spool an upload)
before a router's key dependency ran. The app is driven as the ASGI server drives it, with a
``receive`` that fails the test if the body is asked for."""

from __future__ import annotations

import asyncio
import json

import pytest

from glmserve.chat import ChatTemplate
from glmserve.chat.template import CHATML_TEMPLATE
from glmserve.server import AppOptions, create_app
from glmserve.serving.chat.service import ChatService
from glmserve.serving.generation.pipeline import ModelPipeline
from tests.unit.fakes import FakeEngine, one_model


def _app(**options):
    service = ChatService(ModelPipeline(FakeEngine(reply="Hello"), "fake", ChatTemplate(CHATML_TEMPLATE)))
    return create_app(one_model(service), AppOptions(**options))


def _call(app, method: str, path: str, headers: dict[str, str], body: bytes | None = None) -> tuple[int, dict, bool]:
    """``(status, JSON body, whether the body was read)`` of one request; with ``body`` None the
    body is announced (60 MB) and never sent: reading it fails the request."""
    read = False
    sent: list[dict] = []
    announced = {"content-length": str(60_000_000 if body is None else len(body))}

    async def receive():
        nonlocal read
        read = True
        if body is None:
            raise AssertionError(f"{method} {path}: the body was read before the key was checked")
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "path": path,
             "raw_path": path.encode(), "query_string": b"", "root_path": "", "scheme": "http",
             "server": ("testserver", 80), "client": ("127.0.0.1", 1),
             "headers": [(k.lower().encode(), v.encode()) for k, v in {**announced, **headers}.items()]}
    asyncio.run(app(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    content = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], json.loads(content or b"null"), read


@pytest.mark.parametrize(("method", "path", "headers", "dialect"), [
    ("POST", "/v1/chat/completions", {"authorization": "Bearer wrong", "content-type": "application/json"}, "openai"),
    ("POST", "/v1/chat/completions", {"content-type": "application/json"}, "openai"),
    ("POST", "/v1/messages", {"x-api-key": "wrong", "content-type": "application/json"}, "anthropic"),
    ("POST", "/v1/files", {"authorization": "Bearer wrong", "content-type": "multipart/form-data; boundary=x"}, "openai"),
    ("POST", "/v1/batches", {"authorization": "Bearer wrong", "content-type": "application/json"}, "openai"),
    ("POST", "/v1/messages/batches", {"content-type": "application/json"}, "anthropic"),
    ("POST", "/v1/responses", {"authorization": "Bearer wrong", "content-type": "application/json"}, "openai"),
])
def test_a_wrong_or_missing_key_is_refused_before_the_body(method, path, headers, dialect):
    status, body, read = _call(_app(api_key="k"), method, path, headers)
    assert (status, read) == (401, False)
    if dialect == "anthropic":
        assert body["type"] == "error" and body["error"]["type"] == "authentication_error"
    else:
        assert body["error"]["code"] == "invalid_api_key"


def test_an_admin_route_refuses_a_user_key_before_the_body():
    app = _app(api_key="user", admin_api_key=("admin",), runtime_lora=True)
    status, body, read = _call(app, "POST", "/v1/load_lora_adapter", {"authorization": "Bearer user"})
    assert (status, body["error"]["code"], read) == (403, "insufficient_permissions", False)
    status, body, read = _call(app, "GET", "/metrics", {"authorization": "Bearer user"})
    assert (status, body["error"]["code"], read) == (403, "insufficient_permissions", False)


def test_the_right_key_reads_the_body_and_routes_without_keys_are_open():
    app = _app(api_key="k")
    status, body, read = _call(app, "POST", "/v1/chat/completions", {"authorization": "Bearer k",
                               "content-type": "application/json"}, b'{"model": "fake"}')
    assert read and status == 400 and body["error"]["param"] == "messages"  # past the key: the body was parsed
    status, _, read = _call(app, "GET", "/health", {})
    assert status == 200 and not read
    status, _, read = _call(_app(), "GET", "/v1/models", {})  # a server without keys
    assert status == 200
