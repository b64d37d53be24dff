"""A client that goes away mid-generation aborts its engine request; the server keeps serving.
On both engines."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.conftest import DEFAULT_MODEL, RemoteServer

LONG = {"model": DEFAULT_MODEL, "messages": [{"role": "user", "content": "Count to one thousand."}],
        "max_tokens": 3000, "ignore_eos": True, "temperature": 0}


@pytest.fixture(scope="module", params=["llama_cpp", "transformers"])
def srv(request):
    args = ["--log-level", "info"]
    if request.param == "transformers":
        pytest.importorskip("torch")
        hf = request.getfixturevalue("smollm2_hf")
        args += ["--engine", "transformers", "--model", str(hf), "--served-model-name", DEFAULT_MODEL]
    server = RemoteServer(*args)
    yield server
    server.stop()


def _wait_for_log(server: RemoteServer, needle: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if needle in (log := server.log()):
            return log
        time.sleep(0.2)
    raise AssertionError(f"{needle!r} not in server log:\n{server.log()[-2000:]}")


def test_stream_disconnect_aborts(srv):
    with httpx.stream("POST", f"{srv.url}/v1/chat/completions", json={**LONG, "stream": True}, timeout=60) as resp:
        assert resp.status_code == 200
        seen = 0
        for line in resp.iter_lines():
            if line.startswith("data: ") and "content" in line:
                seen += 1
            if seen >= 5:
                break  # leave the stream: the connection closes
    log = _wait_for_log(srv, "aborted after")
    aborted_after = int(log.split("aborted after ")[1].split()[0])
    assert aborted_after < LONG["max_tokens"]
    reply = srv.client().chat.completions.create(model=DEFAULT_MODEL, messages=[{"role": "user", "content": "Hi"}],
                                                 max_tokens=3)
    assert reply.usage.completion_tokens >= 1


def test_plain_request_disconnect_aborts(srv):
    before = srv.log().count("aborted")
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{srv.url}/v1/chat/completions", json=LONG, timeout=1.5)
    deadline = time.monotonic() + 60
    while srv.log().count("aborted") == before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert srv.log().count("aborted") > before
    body = httpx.post(f"{srv.url}/v1/chat/completions", timeout=60, json={
        "model": DEFAULT_MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}).json()
    assert json.dumps(body)  # a normal answer
    assert body["usage"]["completion_tokens"] >= 1
