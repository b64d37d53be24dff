"""The API dialect is decided in one place: each ``ENDPOINTS`` row names its dialect, any path's
comes from the rows (``dialect_of``), and no module outside the dialects' definitions and the
row's readers picks a stream form, error envelope, key check or OpenAPI error schema by itself,
or branches on a request's path to tell the APIs apart."""

from __future__ import annotations

import ast
from pathlib import Path

from fastapi.testclient import TestClient

from glmserve.chat import ChatTemplate
from glmserve.chat.template import CHATML_TEMPLATE
from glmserve.server import AppOptions, create_app
from glmserve.server.dialects import ANTHROPIC_API, OPENAI_API, RESPONSES_API, Dialect
from glmserve.server.endpoints import ENDPOINTS, dialect_of
from glmserve.serving.chat.service import ChatService
from glmserve.serving.generation.pipeline import ModelPipeline
from tests.unit.fakes import FakeEngine, one_model

SRC = Path(__file__).resolve().parents[3] / "src" / "glmserve"
# where dialects are defined (sse.py: the stream forms; dialects.py: the whole dialect) and
# chosen (endpoints.py: the rows and dialect_of)
DECIDERS = {"server/sse.py", "server/dialects.py", "server/endpoints.py"}
# what only the deciders may import: the stream forms, the key check of one API, an envelope's schema
CHOICES = {("glmserve.server.sse", "OPENAI"), ("glmserve.server.sse", "RESPONSES"),
           ("glmserve.server.sse", "ANTHROPIC"), ("glmserve.server.auth", "require_anthropic_key"),
           ("glmserve.protocol.anthropic", "ErrorEnvelope")}


def test_each_row_names_its_dialect():
    assert all(isinstance(e.dialect, Dialect) for e in ENDPOINTS.values())
    assert {path: e.dialect.name for path, e in ENDPOINTS.items()} == {
        "/v1/chat/completions": "openai", "/v1/completions": "openai", "/v1/embeddings": "openai",
        "/v1/responses": "responses", "/v1/messages": "anthropic"}
    assert dialect_of("/v1/messages/count_tokens") is ANTHROPIC_API
    assert dialect_of("/v1/messages/batches/msgbatch_1/results") is ANTHROPIC_API
    assert dialect_of("/v1/responses/resp_1/input_items") is RESPONSES_API
    assert dialect_of("/v1/messagesX") is OPENAI_API and dialect_of("/v1/models") is OPENAI_API


def _modules():
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if not rel.startswith("vendor/"):
            yield rel, ast.parse(path.read_text(), filename=rel)


def _path_branches(tree: ast.AST) -> list[str]:
    """``x.startswith("/v1/...")`` and ``x == "/v1/..."`` (or ``in``) tests in ``tree``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "startswith":
            args = node.args
        elif isinstance(node, ast.Compare):
            args = [node.left, *node.comparators]
        else:
            continue
        found += [a.value for a in args if isinstance(a, ast.Constant) and isinstance(a.value, str)
                  and a.value.startswith("/v1/")]
    return found


def test_no_module_but_the_deciders_picks_a_dialect():
    """No module but the deciders imports a dialect's parts, passes an ``anthropic=`` flag, or
    tests a path against an API's (``path.startswith("/v1/messages")``)."""
    picked: dict[str, list] = {}
    for rel, tree in _modules():
        if rel in DECIDERS:
            continue
        found: list = [(n.module, a.name) for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                       for a in n.names if (n.module, a.name) in CHOICES]
        found += [f"{kw.arg}=" for n in ast.walk(tree) if isinstance(n, ast.Call) for kw in n.keywords
                  if kw.arg == "anthropic"]
        found += _path_branches(tree)
        if found:
            picked[rel] = found
    assert picked == {}


def _client(**options) -> TestClient:
    engine = FakeEngine(reply="Hello")
    service = ChatService(ModelPipeline(engine, "fake", ChatTemplate(CHATML_TEMPLATE)))
    return TestClient(create_app(one_model(service), AppOptions(**options)))


def test_errors_and_keys_follow_the_paths_dialect():
    """A wrong key and an unknown model, on each API's paths: Anthropic's envelope (and its
    key header) under ``/v1/messages``, OpenAI's elsewhere."""
    with _client(api_key="k") as http:
        for path in ("/v1/messages", "/v1/messages/count_tokens", "/v1/messages/batches"):
            body = http.post(path, json={}, headers={"x-api-key": "wrong"}).json()
            assert body["type"] == "error" and body["error"]["type"] == "authentication_error", path
        ok = http.post("/v1/messages", headers={"x-api-key": "k"}, json={
            "model": "nope", "max_tokens": 5, "messages": [{"role": "user", "content": "Hi"}]})
        assert ok.status_code == 404 and ok.json()["error"]["type"] == "not_found_error"
        for path in ("/v1/chat/completions", "/v1/responses", "/v1/models"):
            wrong = http.post(path, json={}, headers={"authorization": "Bearer wrong"})
            assert wrong.status_code in (401, 405) and "type" not in wrong.json(), path
        chat = http.post("/v1/chat/completions", headers={"authorization": "Bearer k"},
                         json={"model": "nope", "messages": [{"role": "user", "content": "Hi"}]})
        assert chat.status_code == 404 and chat.json()["error"]["code"] == "model_not_found"
    spec = _client().get("/openapi.json").json()
    schema = spec["paths"]["/v1/messages"]["post"]["responses"]["400"]["content"]["application/json"]["schema"]
    assert schema["$ref"].endswith("/ErrorEnvelope")
    schema = spec["paths"]["/v1/responses"]["post"]["responses"]["400"]["content"]["application/json"]["schema"]
    assert schema["$ref"].endswith("/ErrorResponse")
