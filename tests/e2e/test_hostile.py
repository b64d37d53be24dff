"""A hostile client against a real server: schemas of every costly or broken family (at the
limit and past it, through ``response_format`` and through tool parameters), bad encodings and
bad framing. Each case gets a 2xx or 4xx answer (never a 5xx, a hang or a crash), and the server
is alive and healthy after every case."""

from __future__ import annotations

import json
import re
import socket
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import DEFAULT_MODEL, RemoteServer

TEMPLATE = Path(__file__).parent.parent / "fixtures" / "templates" / "chatml-hermes-tools.jinja"
HI = [{"role": "user", "content": "Hi"}]
REPEAT = 1000  # the default --max-schema-repeat
RF_PARAM = "response_format.json_schema.schema"
TOOL_PARAM = "tools.0.function.parameters"
TIMEOUT_S = 2  # --client-header-timeout and --client-body-timeout of this module's server


@pytest.fixture(scope="module")
def srv():
    server = RemoteServer("--chat-template", str(TEMPLATE), "--tool-call-parser", "hermes",
                          "--client-header-timeout", str(TIMEOUT_S), "--client-body-timeout", str(TIMEOUT_S))
    yield server
    server.stop()


def _nested(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


# (id, schema, expected status, expected code or None)
SCHEMAS = [
    # bounded repetitions: at the limit they compile and load; past it they are refused
    ("max-length-at-limit", {"type": "string", "maxLength": REPEAT}, 200, None),
    ("max-length-past-limit", {"type": "string", "maxLength": REPEAT + 1}, 400, "schema_too_large"),
    ("min-length-huge", {"type": "string", "minLength": 100_000}, 400, "schema_too_large"),
    ("max-items-at-limit", {"type": "array", "items": {"type": "integer"}, "maxItems": REPEAT}, 200, None),
    ("max-items-huge", {"type": "array", "items": {"type": "integer"}, "maxItems": 10_000_000}, 400,
     "schema_too_large"),
    ("min-items-huge", {"type": "array", "items": {"type": "integer"}, "minItems": 50_000}, 400, "schema_too_large"),
    ("pattern-quantifier-at-limit", {"type": "string", "pattern": "^[a-z]{0,%d}$" % REPEAT}, 200, None),
    ("pattern-quantifier-huge", {"type": "string", "pattern": "^a{2,100000}$"}, 400, "schema_too_large"),
    ("pattern-nested-quantifiers", {"type": "string", "pattern": "^(a{0,%d}){0,%d}$" % (REPEAT, REPEAT + 1)}, 400,
     "schema_too_large"),
    ("many-long-properties", {"type": "object", "properties": {
        f"p{i}": {"type": "string", "maxLength": REPEAT} for i in range(200)}}, 400, "schema_too_large"),
    ("deep-nesting", _nested(40), 400, "schema_too_large"),
    ("nesting-within-limit", _nested(8), 200, None),
    ("huge-enum", {"enum": [f"value-{i}" for i in range(20_000)]}, 400, "schema_too_large"),
    # $ref: cycles, the root, remote, missing
    ("ref-cycle", {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}, 400,
     "unsupported_schema"),
    ("ref-self", {"$defs": {"a": {"type": "object", "properties": {"x": {"$ref": "#/$defs/a"}}}},
                  "$ref": "#/$defs/a"}, 400, "unsupported_schema"),
    ("ref-root", {"type": "object", "properties": {"x": {"$ref": "#"}}}, 400, "unsupported_schema"),
    ("ref-remote", {"$ref": "https://example.com/schema.json"}, 400, "unsupported_schema"),
    ("ref-missing", {"$ref": "#/$defs/nope"}, 400, "invalid_schema"),
    ("ref-ok", {"$defs": {"city": {"type": "string", "maxLength": 20}}, "type": "object",
                "properties": {"city": {"$ref": "#/$defs/city"}}, "required": ["city"]}, 200, None),
    # patterns the converter cannot enforce, or that are not regular expressions at all
    ("pattern-unanchored", {"type": "string", "pattern": "abc"}, 400, "unsupported_schema"),
    ("pattern-lookahead", {"type": "string", "pattern": "^(?=a)a$"}, 400, "unsupported_schema"),
    ("pattern-backreference", {"type": "string", "pattern": "^(a)\\1$"}, 400, "unsupported_schema"),
    ("pattern-unbalanced", {"type": "string", "pattern": "^(abc$"}, 400, "invalid_schema"),
    # not JSON Schema
    ("type-not-a-json-type", {"type": "strin"}, 400, "invalid_schema"),
    ("properties-not-object", {"type": "object", "properties": []}, 400, "invalid_schema"),
    ("required-not-list", {"type": "object", "required": "a"}, 400, "invalid_schema"),
    ("max-length-negative", {"type": "string", "maxLength": -1}, 400, "invalid_schema"),
    ("schema-not-object", ["type", "string"], 400, None),
]


def _assert_answer(resp: httpx.Response, status: int, code: str | None, param: str | None) -> None:
    assert resp.status_code == status, resp.text[:500]
    if status == 400:
        error = resp.json()["error"]
        assert error["type"] == "invalid_request_error" and error["message"]
        assert error["param"] == param, error
        if code:
            assert error["code"] == code, error


def _healthy(server: RemoteServer) -> None:
    assert server.proc.poll() is None, server.log()[-3000:]
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200


@pytest.mark.parametrize(("schema", "status", "code"), [pytest.param(s, st, c, id=i) for i, s, st, c in SCHEMAS])
def test_response_format_schema(srv, schema, status, code):
    body = {"model": DEFAULT_MODEL, "messages": HI, "max_tokens": 6,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
    resp = httpx.post(f"{srv.url}/v1/chat/completions", json=body, timeout=120)
    _assert_answer(resp, status, code, RF_PARAM)
    _healthy(srv)


def _as_parameters(schema):
    """The schema as a tool's parameters (which must be an object schema)."""
    if isinstance(schema, dict) and schema.get("type") in (None, "object") and "enum" not in schema:
        return schema
    return {"type": "object", "properties": {"value": schema}, "required": ["value"]}


@pytest.mark.parametrize(("schema", "status", "code"), [pytest.param(s, st, c, id=i) for i, s, st, c in SCHEMAS
                                                        if isinstance(s, dict)])
def test_tool_parameters_schema(srv, schema, status, code):
    tool = {"type": "function", "function": {"name": "f", "parameters": _as_parameters(schema)}}
    body = {"model": DEFAULT_MODEL, "messages": HI, "max_tokens": 6, "tools": [tool], "tool_choice": "required"}
    resp = httpx.post(f"{srv.url}/v1/chat/completions", json=body, timeout=120)
    _assert_answer(resp, status, code, TOOL_PARAM)
    _healthy(srv)


def test_invalid_tool_schema_is_400_even_when_not_forced(srv):
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "required": "a"}}}
    body = {"model": DEFAULT_MODEL, "messages": HI, "max_tokens": 2, "tools": [tool]}
    resp = httpx.post(f"{srv.url}/v1/chat/completions", json=body, timeout=60)
    _assert_answer(resp, 400, "invalid_schema", TOOL_PARAM)


@pytest.mark.parametrize(("body", "status"), [
    pytest.param('{"model": "m\\ud800", "messages": [{"role": "user", "content": "Hi"}]}', 404, id="surrogate-model"),
    pytest.param('{"model": "%s", "messages": [{"role": "user", "content": "Hi", "name": "\\udfff"}], "max_tokens": 2}'
                 % DEFAULT_MODEL, 200, id="surrogate-name-unused-by-template"),
    pytest.param('{"model": "%s", "messages": [{"role": "user", "content": "Hi \\udfff"}], "max_tokens": 2}'
                 % DEFAULT_MODEL, 400, id="surrogate-content"),
    pytest.param('{"model": "%s", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, '
                 '"stop": ["\\ud800"]}' % DEFAULT_MODEL, 400, id="surrogate-stop"),
    pytest.param(b'{"model": "\xff\xfe", "messages": []}', 400, id="invalid-utf8"),
    pytest.param(('{"model": "%s", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}'
                  % DEFAULT_MODEL).encode("utf-16"), 200, id="utf16-body"),
    pytest.param(b'{"model": "x", "messages": [{"role": "user", "content": "\x00"}]}', 400, id="raw-nul-byte"),
    pytest.param(b'{"model": "x\\u0000", "messages": [{"role": "user", "content": "Hi"}]}', 404, id="escaped-nul-model"),
    pytest.param('{"model": "%s", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, '
                 '"seed": 1e400}' % DEFAULT_MODEL, 400, id="seed-infinite"),
    pytest.param('{"model": "%s", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": %s}'
                 % (DEFAULT_MODEL, "9" * 5000), 400, id="huge-integer"),
])
def test_encodings(srv, body, status):
    resp = httpx.post(f"{srv.url}/v1/chat/completions", content=body, timeout=60,
                      headers={"content-type": "application/json"})
    assert resp.status_code == status, resp.text[:500]
    if status >= 400:
        assert set(resp.json()["error"]) == {"message", "type", "param", "code"}
    _healthy(srv)


def _raw(server: RemoteServer, data: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT_S + 20)
    sock.sendall(data)
    return sock


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def test_body_shorter_than_content_length_is_408(srv):
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: 1000\r\n\r\n").encode()
    with _raw(srv, head + b'{"model": "') as sock:
        answer = _read_all(sock)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "request_timeout"
    _healthy(srv)


def test_chunked_body_that_never_ends_is_408(srv):
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n5\r\n{\"mod\r\n")
    with _raw(srv, head) as sock:
        answer = _read_all(sock)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    _healthy(srv)


def test_trickling_headers_are_cut_off(srv):
    with _raw(srv, b"POST /v1/chat/completions HTTP/1.1\r\n") as sock:
        closed = False
        for _ in range(4 * (TIMEOUT_S + 10)):  # one header byte every 0.25 s, never a blank line
            try:
                sock.sendall(b"X")
                if sock.recv(1, socket.MSG_DONTWAIT) == b"":
                    closed = True
                    break
            except BlockingIOError:
                pass
            except OSError:
                closed = True
                break
            time.sleep(0.25)
        assert closed, "the server kept a connection whose headers never ended"
    _healthy(srv)


@pytest.mark.parametrize("pieces", [1, 40], ids=["one-write", "in-pieces"])
def test_oversized_headers_are_431(srv, pieces):
    # 40 KiB of headers (the bound is 16 KiB), sent at once or in 1 KiB pieces
    head = b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-Pad-%d: %s\r\n" % (i, b"a" * 1000)
                                                              for i in range(40))
    step = len(head) // pieces + 1
    with _raw(srv, head[:step]) as sock:
        try:
            for i in range(step, len(head), step):
                sock.sendall(head[i:i + step])
        except OSError:  # closed while the rest was being sent
            pass
        answer = _read_all(sock)
    assert answer.startswith(b"HTTP/1.1 431"), answer[:200]
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "request_header_fields_too_large"
    _healthy(srv)


def test_headers_with_a_large_body_and_keep_alive(srv):
    # headers within the bound, sent in the same reads as a 1 MiB body: only the headers count;
    # then the connection serves a second request
    body = json.dumps({"model": DEFAULT_MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1,
                       "user": "u" * (1 << 20)}).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"X-Pad: {'a' * 8000}\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    with httpx.Client(base_url=srv.url, timeout=60) as client:
        reply = client.post("/v1/chat/completions", content=body, headers={
            "content-type": "application/json", "x-pad": "a" * 8000})
        assert reply.status_code in (200, 400), reply.text[:300]
        assert client.get("/health").status_code == 200
    with _raw(srv, head + body) as sock:
        sock.settimeout(60)
        assert sock.recv(64).startswith(b"HTTP/1.1 ")
    _healthy(srv)


def test_garbage_request_line(srv):
    with _raw(srv, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 garbage\r\n\r\n") as sock:
        answer = _read_all(sock)
    assert answer == b"" or answer.startswith(b"HTTP/1.1 4"), answer[:200]
    _healthy(srv)


def test_pattern_with_class_escapes_is_enforced(srv):
    """JSON Schema patterns use ECMA-262 escapes (\\d, \\w, \\.) that llama.cpp's grammars lack;
    they are spelled as classes, and the output matches the pattern."""
    pattern = r"^\d{4}-\d{2}-\d{2}$"
    schema = {"type": "object", "properties": {"date": {"type": "string", "pattern": pattern}}, "required": ["date"]}
    body = {"model": DEFAULT_MODEL, "max_tokens": 40, "temperature": 0,
            "messages": [{"role": "user", "content": "When did the Berlin wall fall? Answer in JSON."}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "d", "schema": schema}}}
    resp = httpx.post(f"{srv.url}/v1/chat/completions", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert re.fullmatch(pattern, json.loads(choice["message"]["content"])["date"])
