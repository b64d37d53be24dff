"""A hostile pass against the state routes (files, batches, message batches, conversations,
stored responses) of a server of two keys: odd, foreign, huge and malformed ids; huge,
malformed, empty and non-UTF-8 uploads; bad list cursors; cancels and deletes racing each other.
Every answer is a 2xx or 4xx (never a 5xx), no key reads another's objects, one key's many
requests do not hold another's back, and the server is healthy after every case."""

from __future__ import annotations

import concurrent.futures
import json
import re
import threading
import time

import httpx
import pytest

from tests.conftest import DEFAULT_MODEL, RemoteServer

KEY, OTHER = "key-a", "key-b"
MAX_BYTES = 1 << 20  # this module's --max-request-bytes


@pytest.fixture(scope="module")
def srv():
    server = RemoteServer("--api-key", KEY, "--api-key", OTHER, "--max-request-bytes", str(MAX_BYTES))
    yield server
    server.stop()


def _call(srv: RemoteServer, method: str, path: str, key: str = KEY, headers: dict | None = None,
          **kwargs) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}", "x-api-key": key, "anthropic-version": "2023-06-01",
               **(headers or {})}
    reply = httpx.request(method, f"{srv.url}{path}", headers=headers, timeout=60, **kwargs)
    assert reply.status_code < 500, (method, path, reply.status_code, reply.text[:300])
    return reply


def _healthy(srv: RemoteServer) -> None:
    assert httpx.get(f"{srv.url}/health", timeout=10).status_code == 200


def _lines(n: int, **body) -> bytes:
    return "\n".join(json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions",
                                 "body": {"model": DEFAULT_MODEL, "max_tokens": 8,
                                          "messages": [{"role": "user", "content": f"Count to {i}."}], **body}})
                     for i in range(n)).encode()


def _upload(srv: RemoteServer, content: bytes, key: str = KEY, purpose: str = "batch") -> httpx.Response:
    return _call(srv, "POST", "/v1/files", key, files={"file": ("in.jsonl", content)}, data={"purpose": purpose})


@pytest.fixture(scope="module")
def owned(srv) -> dict[str, str]:
    """Objects of key A: a file, a batch, a message batch, a conversation with an item, a response."""
    file_id = _upload(srv, _lines(2)).json()["id"]
    batch = _call(srv, "POST", "/v1/batches", json={"input_file_id": file_id, "endpoint": "/v1/chat/completions",
                                                    "completion_window": "24h"}).json()
    message_batch = _call(srv, "POST", "/v1/messages/batches", json={"requests": [
        {"custom_id": "m", "params": {"model": DEFAULT_MODEL, "max_tokens": 4,
                                      "messages": [{"role": "user", "content": "Hi"}]}}]}).json()
    conversation = _call(srv, "POST", "/v1/conversations", json={"items": [
        {"type": "message", "role": "user", "content": "Hello"}]}).json()
    item = _call(srv, "GET", f"/v1/conversations/{conversation['id']}/items").json()["data"][0]
    response = _call(srv, "POST", "/v1/responses", json={"model": DEFAULT_MODEL, "input": "Hi",
                                                         "max_output_tokens": 4}).json()
    return {"file": file_id, "batch": batch["id"], "message_batch": message_batch["id"],
            "conversation": conversation["id"], "item": item["id"], "response": response["id"]}


def _routes(ids: dict[str, str]) -> list[tuple[str, str]]:
    f, b, m, c, i, r = (ids[k] for k in ("file", "batch", "message_batch", "conversation", "item", "response"))
    return [("GET", f"/v1/files/{f}"), ("GET", f"/v1/files/{f}/content"), ("GET", f"/v1/batches/{b}"),
            ("POST", f"/v1/batches/{b}/cancel"), ("GET", f"/v1/messages/batches/{m}"),
            ("GET", f"/v1/messages/batches/{m}/results"), ("GET", f"/v1/conversations/{c}"),
            ("GET", f"/v1/conversations/{c}/items"), ("GET", f"/v1/conversations/{c}/items/{i}"),
            ("GET", f"/v1/responses/{r}"), ("GET", f"/v1/responses/{r}/input_items"),
            ("DELETE", f"/v1/conversations/{c}/items/{i}"), ("DELETE", f"/v1/files/{f}"),
            ("DELETE", f"/v1/batches/{b}"), ("DELETE", f"/v1/messages/batches/{m}"),
            ("DELETE", f"/v1/conversations/{c}"), ("DELETE", f"/v1/responses/{r}")]


def test_another_key_reads_nothing_and_changes_nothing(srv, owned):
    for method, path in _routes(owned):
        assert _call(srv, method, path, OTHER).status_code == 404, (method, path)
    for path in ("/v1/files", "/v1/batches", "/v1/messages/batches"):
        listed = json.dumps(_call(srv, "GET", path, OTHER).json())
        assert not any(object_id in listed for object_id in owned.values()), path
    assert _call(srv, "GET", f"/v1/files/{owned['file']}").status_code == 200  # still A's
    assert _call(srv, "GET", f"/v1/conversations/{owned['conversation']}/items/{owned['item']}").status_code == 200
    _healthy(srv)


ODD_IDS = ["x" * 10_000, "file-%00", "..%2F..%2Fetc%2Fpasswd", "%C3%A9t%C3%A9", "%FF%FE", "batch_'; DROP TABLE x;--",
           "resp_" + "9" * 200, "conv_%E2%80%AE", " ", "msg_\u2028"]


@pytest.mark.parametrize("odd", ODD_IDS, ids=range(len(ODD_IDS)))
def test_odd_ids_are_4xx_everywhere(srv, odd):
    ids = {k: odd for k in ("file", "batch", "message_batch", "conversation", "item", "response")}
    for method, path in _routes(ids):
        assert _call(srv, method, path).status_code in (400, 404, 405), (method, path)
    for path in ("/v1/files", "/v1/batches", "/v1/messages/batches"):
        assert _call(srv, "GET", path, params={"after": odd, "after_id": odd}).status_code in (200, 400)
    _healthy(srv)


def test_bad_uploads_are_4xx(srv):
    assert _upload(srv, b"x" * (MAX_BYTES + 1)).status_code == 413
    assert _upload(srv, b"\xff\xfe\x00garbage").status_code == 400
    assert _upload(srv, _lines(1), purpose="fine-tune").status_code == 400
    assert _call(srv, "POST", "/v1/files", data={"purpose": "batch"}).status_code == 400  # no file
    assert _call(srv, "POST", "/v1/files", content=b"not multipart",
                 headers={"content-type": "multipart/form-data; boundary=zz"}).status_code == 400
    for content in (b"", b"\n\n", b"{}", b"[1, 2]", b"\x00" * 100, b'{"custom_id": "a"}\n' * 3, b"{" * 5000):
        file_id = _upload(srv, content).json()["id"]
        batch = _call(srv, "POST", "/v1/batches", json={"input_file_id": file_id,
                                                        "endpoint": "/v1/chat/completions", "completion_window": "24h"})
        assert batch.status_code == 200 and batch.json()["status"] == "failed", content[:20]
    for body in ({"input_file_id": "file-nope", "endpoint": "/v1/chat/completions", "completion_window": "24h"},
                 {"input_file_id": 5}, {}, {"input_file_id": "x" * 10_000, "endpoint": "/v1/chat/completions",
                                            "completion_window": "24h"}):
        assert _call(srv, "POST", "/v1/batches", json=body).status_code in (400, 404)
    for bad in ({"requests": [{"custom_id": "x" * 100, "params": {}}]}, {"requests": "no"}, {},
                {"requests": [{"custom_id": "a", "params": {"stream": True}}]}):
        assert _call(srv, "POST", "/v1/messages/batches", json=bad).status_code == 400
    for query in ({"limit": 0}, {"limit": 10**9}, {"limit": "x"}, {"order": "sideways"}):
        assert _call(srv, "GET", "/v1/files", params=query).status_code == 400
    _healthy(srv)


def test_racing_cancels_and_deletes_end_one_way(srv):
    file_id = _upload(srv, _lines(30, max_tokens=64)).json()["id"]
    batch_id = _call(srv, "POST", "/v1/batches", json={"input_file_id": file_id, "endpoint": "/v1/chat/completions",
                                                       "completion_window": "24h"}).json()["id"]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        cancels = list(pool.map(lambda _: _call(srv, "POST", f"/v1/batches/{batch_id}/cancel"), range(16)))
        deletes = list(pool.map(lambda _: _call(srv, "DELETE", f"/v1/files/{file_id}"), range(8)))
    assert {r.status_code for r in cancels} <= {200, 400} and 200 in {r.status_code for r in cancels}
    assert sorted(r.status_code for r in deletes) == [200] + [404] * 7
    for _ in range(240):
        batch = _call(srv, "GET", f"/v1/batches/{batch_id}").json()
        if batch["status"] == "cancelled":
            break
        httpx.get(f"{srv.url}/health", timeout=10)
    assert batch["status"] == "cancelled"
    deleted = [_call(srv, "DELETE", f"/v1/batches/{batch_id}") for _ in range(2)]
    assert [r.status_code for r in deleted] == [200, 404]
    _healthy(srv)


def _waiting(srv: RemoteServer) -> float:
    text = _call(srv, "GET", "/metrics").text
    return sum(float(v) for v in re.findall(r"^glmserve:num_requests_waiting(?:\{[^}]*\})? (\S+)$", text, re.M))


def test_one_key_s_many_requests_do_not_hold_another_key_s_back(srv):
    """Key A streams 16 requests at once (8 run, 8 wait: the default ``--max-num-seqs``), each
    longer than the one before, so that slots free one at a time; key B then sends one. B's takes
    the next free slot, ahead of A's 8 waiting (``engine/admission.py``'s turns): its first token
    is the 9th first token, where first in, first out would make it the 17th."""
    first_tokens: list[str] = []
    lock = threading.Lock()

    def ask(key: str, name: str, max_tokens: int) -> None:
        stream = srv.client(api_key=key).chat.completions.create(
            model=DEFAULT_MODEL, messages=[{"role": "user", "content": f"Write about the sea, {name}."}],
            max_tokens=max_tokens, temperature=0, stream=True, extra_body={"ignore_eos": True})
        seen = False
        for chunk in stream:
            if not seen and chunk.choices and chunk.choices[0].delta.content:
                seen = True
                with lock:
                    first_tokens.append(name)
        assert seen, name

    with concurrent.futures.ThreadPoolExecutor(17) as pool:
        futures = [pool.submit(ask, KEY, f"a{i}", 48 + 24 * i) for i in range(16)]
        deadline = time.monotonic() + 120
        while _waiting(srv) < 8 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _waiting(srv) >= 8, "A's 16 requests were never all admitted"
        futures.append(pool.submit(ask, OTHER, "b", 8))
        for future in futures:
            future.result()
    # 8: A's running ones; up to 2 more of A's may take a slot freed before B's request is queued
    assert first_tokens.index("b") <= 10, first_tokens
    _healthy(srv)
