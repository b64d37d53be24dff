"""Batches through the official SDKs, on both state databases (SQLite, then PostgreSQL):
OpenAI's Files and Batch API over each endpoint, Anthropic's Message Batches through the
``anthropic`` SDK; a 200-line batch that completes, one that survives its server's SIGKILL
(no line missing or doubled, no recorded line run again), two servers of different models on
one database, each answering its own model's lines, cancelling, deleting, invalid files, and
keys that do not see each other's files and batches."""

from __future__ import annotations

import json
import tempfile
import time
import uuid

import anthropic
import httpx
import openai
import pytest

from glmserve.testing import RemoteServer
from tests.e2e.keyed_state import GREEDY, KEY, OTHER_KEY, client, metric, model, server  # noqa: F401 (fixtures)

ENDED = ("completed", "failed", "cancelled", "expired")


def _own_database(state_backend, request) -> dict[str, str]:
    """The environment of servers on a state database of their own (a fresh SQLite folder, or
    a fresh database on the tests' PostgreSQL cluster): no other server claims their lines."""
    if state_backend[0] == "sqlite":
        return {"GLMSERVE_STATE_DIR": tempfile.mkdtemp(prefix="glmserve-state-")}
    import psycopg

    url = request.getfixturevalue("postgres").url
    name = f"batches_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return {"GLMSERVE_DATABASE_URL": url.rsplit("/", 1)[0] + f"/{name}"}


def _chat_lines(model: str, n: int, max_tokens: int = 4) -> list[dict]:
    return [{"custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions",
             "body": {"model": model, "max_tokens": max_tokens,
                      "messages": [{"role": "user", "content": f"Say the number {i}."}]}} for i in range(n)]


def _upload(client: openai.OpenAI, lines: list[dict]) -> str:
    data = "\n".join(json.dumps(line) for line in lines).encode()
    return client.files.create(file=("batch.jsonl", data), purpose="batch").id


def _wait(client: openai.OpenAI, batch_id: str, timeout: float = 600):
    deadline = time.monotonic() + timeout
    batch = client.batches.retrieve(batch_id)
    while batch.status not in ENDED and time.monotonic() < deadline:
        time.sleep(0.5)
        batch = client.batches.retrieve(batch_id)
    return batch


def _records(client: openai.OpenAI, file_id: str | None) -> list[dict]:
    return [] if file_id is None else [json.loads(x) for x in client.files.content(file_id).text.splitlines()]


def _running(server: RemoteServer) -> float:
    return metric(server, "glmserve:num_requests_running")


def _successes(server: RemoteServer) -> int:
    return int(metric(server, "glmserve:request_success_total"))


def test_a_batch_of_200_chat_requests_completes(client, model):
    lines = _chat_lines(model, 200) + [{"custom_id": "no-messages", "method": "POST", "url": "/v1/chat/completions",
                                        "body": {"model": model, "messages": []}}]
    file_id = _upload(client, lines)
    assert client.files.retrieve(file_id).bytes > 0
    batch = client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h",
                                  metadata={"job": "eval"})
    assert (batch.status, batch.request_counts.total, batch.metadata) == ("in_progress", 201, {"job": "eval"})
    batch = _wait(client, batch.id)
    assert batch.status == "completed" and batch.completed_at
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (201, 200, 1)
    output = _records(client, batch.output_file_id)
    assert sorted(r["custom_id"] for r in output) == sorted(f"line-{i}" for i in range(200))
    for record in output:
        assert record["response"]["status_code"] == 200 and record["error"] is None
        assert record["response"]["body"]["object"] == "chat.completion"
        assert record["response"]["body"]["choices"][0]["message"]["content"]
    errors = _records(client, batch.error_file_id)
    assert [(e["custom_id"], e["response"]["status_code"], e["response"]["body"]["error"]["param"])
            for e in errors] == [("no-messages", 400, "messages")]
    # greedy: a line's answer is the same request's answer outside a batch
    alone = client.chat.completions.create(**_chat_lines(model, 8)[7]["body"])
    assert next(r for r in output if r["custom_id"] == "line-7")["response"]["body"]["choices"][0]["message"][
        "content"] == alone.choices[0].message.content
    assert batch.id in [b.id for b in client.batches.list(limit=100).data]
    # an ended batch is deleted with the files made for it (not in OpenAI's API: its batches are kept)
    deleted = httpx.delete(f"{client.base_url}batches/{batch.id}", headers={"Authorization": f"Bearer {KEY}"})
    assert deleted.status_code == 200 and deleted.json() == {"id": batch.id, "object": "batch", "deleted": True}
    for gone in (lambda: client.batches.retrieve(batch.id), lambda: client.files.retrieve(batch.output_file_id)):
        with pytest.raises(openai.NotFoundError):
            gone()
    assert client.files.retrieve(file_id).id == file_id


@pytest.mark.parametrize("endpoint, body", [
    ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 4}),
    ("/v1/embeddings", {"input": "hello"}),
    ("/v1/responses", {"input": "Say hi.", "max_output_tokens": 4}),
    ("/v1/messages", {"max_tokens": 4, "messages": [{"role": "user", "content": "Say hi."}]}),
])
def test_each_endpoint_in_a_batch(client, model, endpoint, body):
    lines = [{"custom_id": f"c{i}", "method": "POST", "url": endpoint, "body": {"model": model, **body}}
             for i in range(2)]
    batch = _wait(client, client.batches.create(input_file_id=_upload(client, lines), endpoint=endpoint,
                                                completion_window="24h").id)
    assert (batch.status, batch.request_counts.completed, batch.request_counts.failed) == ("completed", 2, 0)
    kinds = {r["response"]["body"].get("object") or r["response"]["body"].get("type")
             for r in _records(client, batch.output_file_id)}
    assert kinds == {{"/v1/completions": "text_completion", "/v1/embeddings": "list", "/v1/responses": "response",
                      "/v1/messages": "message"}[endpoint]}


def test_a_batch_fills_the_engine_and_a_cancelled_one_stops(server, client, model):
    batch = client.batches.create(input_file_id=_upload(client, _chat_lines(model, 200, max_tokens=32)),
                                  endpoint="/v1/chat/completions", completion_window="24h")
    deadline = time.monotonic() + 120
    while _running(server) < 8 and time.monotonic() < deadline:  # the engine's whole batch (--max-num-seqs 8)
        time.sleep(0.05)
    assert _running(server) == 8
    while client.batches.retrieve(batch.id).request_counts.completed < 4:
        time.sleep(0.2)
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled")
    batch = _wait(client, batch.id)
    assert batch.status == "cancelled" and batch.cancelled_at
    output = _records(client, batch.output_file_id)
    assert 4 <= len(output) < 200 and len(output) == batch.request_counts.completed
    assert len({r["custom_id"] for r in output}) == len(output)
    with pytest.raises(openai.BadRequestError):
        client.batches.cancel(batch.id)


def test_invalid_input_is_refused_or_fails_the_batch(client, model):
    good = _chat_lines(model, 1)[0]
    bad_lines = [good, "not json", {**good}, {**good, "custom_id": "x", "url": "/v1/embeddings"},
                 {**good, "custom_id": "y", "method": "GET"}]
    data = "\n".join(x if isinstance(x, str) else json.dumps(x) for x in bad_lines).encode()
    file_id = client.files.create(file=("bad.jsonl", data), purpose="batch").id
    batch = client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    assert batch.status == "failed"
    assert [(e.code, e.line) for e in batch.errors.data] == [
        ("invalid_json_line", 2), ("duplicate_custom_id", 3), ("mismatched_url", 4), ("invalid_method", 5)]
    with pytest.raises(openai.BadRequestError):
        client.files.create(file=("x.jsonl", b"{}"), purpose="fine-tune")
    with pytest.raises(openai.BadRequestError):
        client.files.create(file=("x.bin", b"\xff\xfe"), purpose="batch")
    with pytest.raises(openai.BadRequestError):
        client.batches.create(input_file_id=file_id, endpoint="/v1/images", completion_window="24h")
    with pytest.raises(openai.NotFoundError):
        client.batches.create(input_file_id="file-nope", endpoint="/v1/chat/completions", completion_window="24h")
    client.files.delete(file_id)
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(file_id)


def test_files_and_batches_belong_to_their_key(server, client, model):
    other = server.client(api_key=OTHER_KEY)
    file_id = _upload(client, _chat_lines(model, 2))
    batch = client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    for call in (lambda: other.files.retrieve(file_id), lambda: other.files.content(file_id),
                 lambda: other.files.delete(file_id), lambda: other.batches.retrieve(batch.id),
                 lambda: other.batches.cancel(batch.id),
                 lambda: other.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                              completion_window="24h")):
        with pytest.raises(openai.NotFoundError):
            call()
    assert file_id not in [f.id for f in other.files.list()]
    assert _wait(client, batch.id).status == "completed"


def test_anthropic_message_batch_through_the_sdk(server, model):
    client = anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0)
    requests = [{"custom_id": f"q{i}", "params": {"model": model, "max_tokens": 4,
                                                  "messages": [{"role": "user", "content": f"Say {i}."}]}}
                for i in range(6)] + [{"custom_id": "bad", "params": {"model": model, "max_tokens": 4, "messages": []}}]
    batch = client.messages.batches.create(requests=requests)
    assert batch.processing_status == "in_progress" and batch.request_counts.processing == 7
    deadline = time.monotonic() + 300
    while batch.processing_status != "ended" and time.monotonic() < deadline:
        time.sleep(0.3)
        batch = client.messages.batches.retrieve(batch.id)
    assert (batch.request_counts.succeeded, batch.request_counts.errored) == (6, 1)
    results = {r.custom_id: r.result for r in client.messages.batches.results(batch.id)}
    assert set(results) == {f"q{i}" for i in range(6)} | {"bad"}
    assert all(results[f"q{i}"].type == "succeeded" and results[f"q{i}"].message.content[0].text for i in range(6))
    assert results["bad"].type == "errored" and results["bad"].error.error.type == "invalid_request_error"
    assert batch.id in [b.id for b in client.messages.batches.list()]
    with pytest.raises(anthropic.NotFoundError):
        anthropic.Anthropic(base_url=server.url, api_key=OTHER_KEY, max_retries=0).messages.batches.retrieve(batch.id)
    client.messages.batches.delete(batch.id)
    with pytest.raises(anthropic.NotFoundError):
        client.messages.batches.retrieve(batch.id)


KILLED_LINES = 48  # the server is killed a third of the way through


def _recorded(env: dict[str, str], batch_id: str) -> int:
    """The batch's lines recorded as done in the state database of servers run with ``env``."""
    from glmserve.state import BatchStore, open_database

    url = env.get("GLMSERVE_DATABASE_URL") or f"sqlite:///{env['GLMSERVE_STATE_DIR']}/state.db"
    database = open_database(url)
    try:
        return BatchStore(database).counts(batch_id)[1]
    finally:
        database.dispose()


LEASE = ("--batch-lease", "4s")  # the killed server's claims lapse after 4 s (30 s by default)


def test_a_batch_survives_sigkill_with_no_line_missing_or_doubled(state_backend, request, model):
    """A server SIGKILLed a third of the way through a batch; a new one on the same database
    finishes it: every line answered once in the output, and the new server runs exactly the
    lines that the database had not recorded at the kill (counted there after it), none more,
    the lines in flight at the kill once their ``--batch-lease`` lapsed."""
    env = _own_database(state_backend, request)  # the restarted server is the only one to resume it
    first = RemoteServer("--api-key", KEY, *GREEDY, *LEASE, env=env)
    try:
        client = first.client(api_key=KEY)
        batch = client.batches.create(input_file_id=_upload(client, _chat_lines(model, KILLED_LINES, max_tokens=8)),
                                      endpoint="/v1/chat/completions", completion_window="24h")
        deadline = time.monotonic() + 300
        while client.batches.retrieve(batch.id).request_counts.completed < KILLED_LINES // 3:
            assert time.monotonic() < deadline, "the first server did not complete a third of the batch in 300 s"
            time.sleep(0.1)
        first.proc.kill()  # SIGKILL: lines in flight are lost with their claims
        first.proc.wait()
    finally:
        first.stop()
    recorded = _recorded(env, batch.id)  # what survived the kill, read after it
    assert KILLED_LINES // 3 <= recorded < KILLED_LINES
    second = RemoteServer("--api-key", KEY, *GREEDY, *LEASE, env=env)
    try:
        client = second.client(api_key=KEY)
        batch = _wait(client, batch.id)
        assert "not renewed for --batch-lease 4s" in second.log()
        assert batch.status == "completed"
        assert (batch.request_counts.completed, batch.request_counts.failed) == (KILLED_LINES, 0)
        output = _records(client, batch.output_file_id)
        assert sorted(r["custom_id"] for r in output) == sorted(f"line-{i}" for i in range(KILLED_LINES))
        assert batch.error_file_id is None
        assert _successes(second) == KILLED_LINES - recorded  # no recorded line ran again, none ran twice
    finally:
        second.stop()


def test_servers_of_different_models_each_run_their_own_lines(state_backend, request):
    """Two servers of one user on one state database, serving different models: every line of
    a batch holding both models' requests is answered by its own model (none is taken by the
    other server and stored as a 404), whichever server the batch was made on."""
    env = _own_database(state_backend, request)
    servers = [RemoteServer("--api-key", KEY, "--served-model-name", name, *GREEDY, env=env)
               for name in ("alpha", "beta")]
    try:
        client = servers[0].client(api_key=KEY)
        lines = [{**line, "custom_id": f"{name}-{i}", "body": {**line["body"], "model": name}}
                 for name in ("alpha", "beta") for i, line in enumerate(_chat_lines("", 6))]
        batch = _wait(client, client.batches.create(input_file_id=_upload(client, lines),
                                                    endpoint="/v1/chat/completions", completion_window="24h").id)
        assert (batch.status, batch.request_counts.completed, batch.request_counts.failed) == ("completed", 12, 0)
        assert batch.error_file_id is None
        output = _records(client, batch.output_file_id)
        assert {r["custom_id"]: r["response"]["body"]["model"] for r in output} == {
            line["custom_id"]: line["body"]["model"] for line in lines}
        assert all(_successes(server) == 6 for server in servers)  # each ran its own six
    finally:
        for server in servers:
            server.stop()
