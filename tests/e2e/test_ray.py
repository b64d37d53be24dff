"""``glmserve serve --replicas 2 --ray-address ...`` on a simulated two-node Ray cluster
(``ray.cluster_utils.Cluster``: a head and a second node of one CPU each, so the two replicas
land on different nodes), the default model on llama_cpp with one thread per replica, through
the official ``openai`` client and raw HTTP.

Each replica runs one request at a time (``--max-num-seqs 1``), so concurrent requests must
use both, and a replica's in-flight requests are known from the replica header of their
streams. Killing a replica's process (SIGKILL) must fail only the requests it was serving."""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from glmserve.testing import RemoteServer
from tests.conftest import DEFAULT_MODEL
from tests.postgres import PostgresServer

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402
from ray.util.state import list_actors  # noqa: E402

from glmserve.deploy.ray import PROXY_CALLBACK, PROXY_CALLBACK_ENV  # noqa: E402

SYSTEM = {"role": "system", "content": "You are a helpful AI assistant."}
QUESTION = {"role": "user", "content": "What is the capital of France?"}
REPLICA = "x-glmserve-replica"
LONG = {"max_tokens": 400, "extra_body": {"ignore_eos": True}}  # runs for seconds on one thread
SETTLE_S = 240


def replica_actors() -> dict[str, object]:
    """The live replica actors by replica id (the id is the last part of the actor's name)."""
    actors = list_actors(filters=[("state", "=", "ALIVE"), ("ray_namespace", "=", "serve")])
    return {a.name.rsplit("#", 1)[-1]: a for a in actors if a.name.startswith("SERVE_REPLICA::")}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    os.environ[PROXY_CALLBACK_ENV] = PROXY_CALLBACK  # the proxy starts inside this cluster
    try:
        node = {"num_cpus": 1, "object_store_memory": 200 * 1024 * 1024}  # requests pass no objects
        c = Cluster(initialize_head=True, head_node_args=node)
        c.add_node(**node)
        c.wait_for_nodes()
    finally:
        del os.environ[PROXY_CALLBACK_ENV]
    ray.init(address=c.address)
    yield c
    ray.shutdown()
    c.shutdown()


@pytest.fixture(scope="module")
def server(cluster: Cluster, postgres: PostgresServer) -> Iterator[RemoteServer]:
    """Two replicas sharing one PostgreSQL database for their stored responses."""
    srv = RemoteServer("--replicas", "2", "--ray-address", cluster.address, "--replica-cpus", "1",
                       "--max-num-seqs", "1", "--max-queue", "2", "--database-url", postgres.url, n_threads=1,
                       startup_timeout=SETTLE_S)
    srv.wait_for_replicas(2, SETTLE_S)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server: RemoteServer) -> openai.OpenAI:
    return server.client()


def _chat(client: openai.OpenAI, **kwargs):
    return client.chat.completions.create(model=DEFAULT_MODEL, messages=[SYSTEM, QUESTION], temperature=0,
                                          **kwargs)


def test_two_replicas_on_two_nodes(server):
    actors = replica_actors()
    assert len(actors) == 2
    assert len({a.node_id for a in actors.values()}) == 2


def test_answers_and_stream_equals_plain(client):
    raw = client.chat.completions.with_raw_response.create(
        model=DEFAULT_MODEL, messages=[SYSTEM, QUESTION], temperature=0, max_tokens=32)
    assert raw.headers[REPLICA] in replica_actors()
    assert raw.headers["x-request-id"] and "," not in raw.headers["x-request-id"]  # sent once
    text = raw.parse().choices[0].message.content
    assert "Paris" in text
    chunks = _chat(client, max_tokens=32, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text


def test_concurrent_requests_use_both_replicas(server, client):
    def one(_):
        return client.chat.completions.with_raw_response.create(
            model=DEFAULT_MODEL, messages=[SYSTEM, QUESTION], temperature=0, max_tokens=32)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(one, range(4)))
    assert {r.headers[REPLICA] for r in replies} == set(replica_actors())
    assert len({r.parse().choices[0].message.content for r in replies}) == 1  # greedy: same answer


def test_an_agent_session_stays_on_one_replica(server, client):
    """One session's requests (named by prompt_cache_key as Codex sends it, metadata.user_id as
    Claude Code sends it, or the x-session-affinity header) are all served by one replica, and
    sessions spread over both (Ray Serve's default router sends requests one after the other to
    the replica on the proxy's node: every session on one replica)."""
    def replica(path: str, body: dict, headers: dict | None = None) -> str:
        resp = httpx.post(f"{server.url}{path}", json={"model": DEFAULT_MODEL, "max_tokens": 1, **body},
                          headers=headers or {}, timeout=120)
        assert resp.status_code == 200, resp.text
        return resp.headers[REPLICA]

    chat = {"messages": [QUESTION]}
    sessions = [("/v1/chat/completions", {**chat, "prompt_cache_key": "codex-session-1"}, None),
                ("/v1/messages", {**chat, "metadata": {"user_id": "user_1_account_2_session_3"}}, None),
                ("/v1/chat/completions", chat, {"x-session-affinity": "session-4"})]
    for path, body, headers in sessions:
        assert len({replica(path, body, headers) for _ in range(12)}) == 1, (path, body, headers)
    spread = {replica("/v1/chat/completions", {**chat, "prompt_cache_key": f"key-{i}"}) for i in range(20)}
    assert spread == set(replica_actors())


def test_a_response_stored_on_one_replica_continues_on_the_other(server, client):
    """Both replicas keep their responses in one PostgreSQL database: a ``previous_response_id``
    made on one replica is continued, read and listed on the other."""
    first = client.responses.with_raw_response.create(model=DEFAULT_MODEL, input="My name is Ada.",
                                                      max_output_tokens=4, temperature=0,
                                                      extra_headers={"x-session-affinity": "first"})
    made_on, made = first.headers[REPLICA], first.parse()
    for i in range(40):  # sessions spread over both replicas: find one on the other
        raw = client.responses.with_raw_response.create(
            model=DEFAULT_MODEL, input="What is my name?", previous_response_id=made.id, max_output_tokens=4,
            temperature=0, extra_headers={"x-session-affinity": f"next-{i}"})
        if raw.headers[REPLICA] != made_on:
            break
    assert raw.headers[REPLICA] != made_on
    after = raw.parse()
    assert after.usage.input_tokens > made.usage.input_tokens + made.usage.output_tokens
    items = client.responses.input_items.list(after.id, order="asc").data
    assert [i.content[0].text for i in items] == ["My name is Ada.", made.output_text, "What is my name?"]
    assert client.responses.retrieve(made.id).output_text == made.output_text


def test_health_answers_for_the_deployment(server):
    body = httpx.get(f"{server.url}/health").json()
    assert body["status"] == "ok" and body["replica"] in replica_actors()
    assert body["deployment"] == {"status": "HEALTHY", "replicas": {"RUNNING": 2}}


def test_overload_is_429_with_retry_after(server):
    body = {"model": DEFAULT_MODEL, "messages": [SYSTEM, QUESTION], "max_tokens": 64, "ignore_eos": True}

    def one(_):
        return httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120)

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        replies = list(pool.map(one, range(16)))
    statuses = [r.status_code for r in replies]
    assert set(statuses) == {200, 429}, statuses
    for r in replies:
        if r.status_code == 429:
            assert int(r.headers["retry-after"]) >= 1
            assert r.json()["error"]["type"]  # an OpenAI error body, also from Ray Serve's router
        else:
            assert r.json()["usage"]["completion_tokens"] == 64
    server.wait_for_replicas(2, 30)


def _kill_replica(replica_id: str) -> None:
    actor = replica_actors()[replica_id]
    os.kill(actor.pid, signal.SIGKILL)
    deadline = time.monotonic() + SETTLE_S  # until Ray knows it is dead
    while replica_id in replica_actors() and time.monotonic() < deadline:
        time.sleep(0.5)


def _stream(url: str, started: concurrent.futures.Future) -> dict:
    """One long SSE stream: its replica (set into ``started`` once the stream began), its data
    events, and whether it ended with ``[DONE]``."""
    body = {"model": DEFAULT_MODEL, "messages": [SYSTEM, QUESTION], "stream": True, "max_tokens": 400,
            "ignore_eos": True}
    events = []
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=300) as r:
        started.set_result(r.headers[REPLICA])
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
    return {"replica": started.result(), "done": events[-1] == "[DONE]",
            "events": [json.loads(e) for e in events if e != "[DONE]"]}


def test_kill_a_replica_during_streams(server, client):
    _until_both_replicas_serve(client)
    started = [concurrent.futures.Future() for _ in range(2)]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(_stream, server.url, s) for s in started]
        replicas = [s.result(timeout=120) for s in started]
        assert set(replicas) == set(replica_actors())  # one stream on each replica
        _kill_replica(replicas[0])
        failed, survived = (f.result(timeout=300) for f in futures)
    assert not failed["done"]
    assert failed["events"][-1]["error"]["code"] == "replica_failed"
    assert survived["done"] and "error" not in survived["events"][-1]
    assert sum(len(e["choices"][0]["delta"].get("content") or "") for e in survived["events"]
               if e.get("choices")) > 0
    # every later request succeeds, on the replica left or on the one Ray starts again
    for _ in range(4):
        assert "Paris" in _chat(client, max_tokens=32).choices[0].message.content
    server.wait_for_replicas(2, SETTLE_S)


def test_kill_a_replica_during_plain_requests(server, client):
    """The first request's replica is killed while it serves it (found by Ray Serve's count of
    its ongoing requests, once the replicas are idle); the second request, sent once the first
    runs, is served by the other replica (each replica serves one request at a time) and must
    succeed."""
    def one(_):
        return httpx.post(f"{server.url}/v1/chat/completions", timeout=300, json={
            "model": DEFAULT_MODEL, "messages": [SYSTEM, QUESTION], "max_tokens": 400, "ignore_eos": True})

    _until_both_replicas_serve(client)
    _until_idle()  # a replica's count of ongoing requests drops a moment after its reply
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(one, 0)
        serving = _until_serving(lambda ongoing: [r for r, n in ongoing.items() if n == 1], first)
        second = pool.submit(one, 1)
        time.sleep(0.5)  # on its way to the other replica (the first one is full)
        _kill_replica(serving[0])
        failed, survived = first.result(timeout=300), second.result(timeout=300)
    assert failed.status_code == 502 and failed.json()["error"]["code"] == "replica_failed"
    assert survived.status_code == 200 and survived.json()["usage"]["completion_tokens"] == 400
    assert "Paris" in _chat(client, max_tokens=32).choices[0].message.content
    server.wait_for_replicas(2, SETTLE_S)


def _until_idle(timeout: float = 60) -> None:
    """Until no replica counts an ongoing request in three polls in a row."""
    deadline = time.monotonic() + timeout
    quiet = 0
    while quiet < 3:
        ongoing = _ongoing()
        quiet = quiet + 1 if not any(ongoing.values()) else 0
        assert time.monotonic() < deadline, f"the replicas stay busy: {ongoing}"
        time.sleep(0.2)


def _until_serving(found, request: concurrent.futures.Future, timeout: float = 120) -> list[str]:
    """Poll the replicas' ongoing requests until ``found(ongoing)`` names a replica, and return
    the names; fails when ``request`` ends first or ``timeout`` s pass, with every state seen."""
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline and not request.done():
        ongoing = _ongoing()
        if names := found(ongoing):
            return names
        if not seen or seen[-1] != ongoing:
            seen.append(ongoing)
        time.sleep(0.1)
    raise AssertionError(f"no replica was seen serving the request (done: {request.done()}); states: {seen}")


def _until_both_replicas_serve(client: openai.OpenAI) -> None:
    """Until concurrent requests are answered by both live replicas: a replica Ray started
    again is RUNNING (``wait_for_replicas``) before every router sends it requests."""
    deadline = time.monotonic() + SETTLE_S
    seen: set[str] = set()
    while time.monotonic() < deadline:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            replies = list(pool.map(lambda _: client.chat.completions.with_raw_response.create(
                model=DEFAULT_MODEL, messages=[SYSTEM, QUESTION], max_tokens=8), range(2)))
        seen = {r.headers[REPLICA] for r in replies}
        if seen == set(replica_actors()):
            return
        time.sleep(1)
    raise AssertionError(f"only replicas {seen} of {set(replica_actors())} answered")


def _ongoing() -> dict[str, int]:
    """Requests each replica is serving, by replica id, from Ray Serve's replica actors."""
    ids, actors = zip(*((i, ray.get_actor(a.name, namespace="serve")) for i, a in replica_actors().items()))
    return dict(zip(ids, ray.get([a.get_num_ongoing_requests.remote() for a in actors], timeout=30)))


def test_sigterm_drains_running_streams(server):
    """Last in this module: it stops the server. A stream running at SIGTERM finishes (Ray
    Serve drains a replica for up to --shutdown-timeout), and the server exits cleanly."""
    started: concurrent.futures.Future = concurrent.futures.Future()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(_stream, server.url, started)
        started.result(timeout=120)
        server.proc.send_signal(signal.SIGTERM)
        result = future.result(timeout=300)
    assert result["done"]
    finals = [e["choices"][0].get("finish_reason") for e in result["events"] if e.get("choices")]
    assert finals[-1] == "length"  # all 400 tokens
    assert server.proc.wait(timeout=120) == 0
