"""The batch runner over a real SQLite state (``serving/batches/runner.py``, ``state/batches.py``):
lines run only where their model is served, transient refusals are retried and never stored,
a line that keeps failing is recorded once, a batch expires at the end of its window, and ended
batches can be deleted with the files made for them. The HTTP side: ``tests/e2e/test_batches.py``."""

from __future__ import annotations

import asyncio
import json
import threading
from collections import Counter

import pytest
import sqlalchemy as sa

from glmserve.server.endpoints import ENDPOINTS
from glmserve.serving.batches import runner as batch_runner
from glmserve.serving.batches import message_batches
from glmserve.serving.batches.runner import Activity, BatchRunner
from glmserve.serving.batches.service import BatchService
from glmserve.state import BatchStore, FileStore, ResponseStore, open_database
from glmserve.state.tables import BATCH_LINES, BATCHES


def _service(tmp_path) -> BatchService:
    database = open_database(f"sqlite:///{tmp_path / 'state.db'}")
    return BatchService(BatchStore(database), FileStore(ResponseStore(database, 100.0, 1 << 30)))


def _jsonl(models: list[str]) -> bytes:
    return "\n".join(json.dumps({"custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions",
                                 "body": {"model": model, "messages": [{"role": "user", "content": f"hi {i}"}]}})
                     for i, model in enumerate(models)).encode()


async def _batch(service: BatchService, models: list[str]) -> dict:
    file = await service.file_service.upload("", "batch", "in.jsonl", _jsonl(models))
    return await service.create("", file["id"], "/v1/chat/completions", "24h", None, ENDPOINTS)


def _runner(service: BatchService, dispatch, models=None, lease_s: float = batch_runner.LEASE_S) -> BatchRunner:
    return BatchRunner(service, dispatch, lambda: 4, Activity(), poll_s=0.05, models=models, lease_s=lease_s)


async def _until(predicate, timeout: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def _run(runners: list[BatchRunner], predicate, timeout: float = 30.0) -> None:
    tasks = [asyncio.create_task(r.run_forever()) for r in runners]
    try:
        await _until(predicate, timeout)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for runner in runners:
            await runner.close()


async def _records(service: BatchService, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    _, pieces = await service.file_service.file_content("", file_id)
    return [json.loads(x) for x in b"".join([piece async for piece in pieces]).decode().splitlines()]


# what the fake dispatches saw that they must not: an assert inside one would be caught by the
# runner's `except Exception` (a line whose run raised) and never fail the test, so each is kept
# here and ``_no_violations`` fails the test after its run
VIOLATIONS: list[str] = []


@pytest.fixture(autouse=True)
def _no_violations():
    VIOLATIONS.clear()
    yield
    assert VIOLATIONS == []


def _answering(served: str, calls: Counter):
    async def dispatch(owner: str, url: str, body: dict) -> tuple[int, dict]:
        calls[body["messages"][0]["content"], body["model"]] += 1
        if body["model"] != served:
            VIOLATIONS.append(f"a {served} server ran a line for {body['model']}")
        return 200, {"object": "chat.completion", "model": served}
    return dispatch


def test_each_server_runs_only_the_lines_of_the_models_it_serves(tmp_path):
    """Two servers of different models on one database each answer their own model's lines;
    a line of a model no server has stays queued, and the batch expires with it listed."""
    service = _service(tmp_path)
    calls: Counter = Counter()

    async def scenario() -> dict:
        batch = await _batch(service, ["a", "b", "a-alias", "b", "c", "a"])
        runners = [_runner(service, _answering("a", calls), lambda: {"a"}),
                   _runner(service, _answering("b", calls), lambda: {"b"})]

        async def only_c_left() -> bool:
            got = await service.get("", batch["id"])
            return got["request_counts"]["completed"] == 4

        await _run(runners, only_c_left)
        assert (await service.get("", batch["id"]))["status"] == "in_progress"  # line-4 waits for a "c" server
        assert sum(calls.values()) == 4  # "a-alias" is no model of either: never claimed
        with service.batches.database.begin() as conn:  # its window ends
            conn.execute(sa.update(BATCHES).values(expires_at=0))
        await _run([_runner(service, _answering("a", calls), lambda: {"a"})],
                   lambda: _status_is(service, batch["id"], "expired"))
        return await service.get("", batch["id"])

    ended = asyncio.run(scenario())
    assert ended["expired_at"] is not None and ended["request_counts"] == {"total": 6, "completed": 4, "failed": 0}
    output = asyncio.run(_records(service, ended["output_file_id"]))
    assert sorted(r["custom_id"] for r in output) == ["line-0", "line-1", "line-3", "line-5"]
    assert {r["custom_id"]: r["response"]["body"]["model"] for r in output} == {
        "line-0": "a", "line-1": "b", "line-3": "b", "line-5": "a"}
    errors = asyncio.run(_records(service, ended["error_file_id"]))
    assert [(r["custom_id"], r["error"]["code"]) for r in errors] == [("line-2", "batch_expired"),
                                                                      ("line-4", "batch_expired")]


async def _status_is(service: BatchService, batch_id: str, status: str) -> bool:
    return (await service.get("", batch_id))["status"] == status


def test_transient_refusals_are_retried_with_back_off_never_stored(tmp_path, monkeypatch):
    monkeypatch.setattr(batch_runner, "backoff_s", lambda retries: 0.05 * retries)
    service = _service(tmp_path)
    refusals: Counter = Counter()

    async def busy_at_first(owner: str, url: str, body: dict) -> tuple[int, dict]:
        key = json.dumps(body)
        if refusals[key] < 3:
            refusals[key] += 1
            status = (503, 429, 503)[refusals[key] - 1]
            return status, {"error": {"message": "busy", "type": "server_error", "param": None, "code": "model_busy"}}
        return 200, {"ok": True}

    async def scenario() -> dict:
        batch = await _batch(service, ["m", "m"])
        await _run([_runner(service, busy_at_first)], lambda: _status_is(service, batch["id"], "completed"))
        return await service.get("", batch["id"])

    ended = asyncio.run(scenario())
    assert ended["request_counts"] == {"total": 2, "completed": 2, "failed": 0} and ended["error_file_id"] is None
    assert list(refusals.values()) == [3, 3]  # each line refused three times, then answered once


def test_a_line_that_never_finishes_is_recorded_failed_once(tmp_path):
    """A line whose run raises, or whose server dies on it, is claimed again after the lease;
    after ``MAX_LOST`` lost runs it is recorded as a 500 without running again."""
    service = _service(tmp_path)
    runs: Counter = Counter()

    async def breaks_on_poison(owner: str, url: str, body: dict) -> tuple[int, dict]:
        runs[body["model"]] += 1
        if body["model"] == "poison":
            raise RuntimeError("the handler broke")
        return 200, {"ok": True}

    async def scenario() -> dict:
        batch = await _batch(service, ["m", "poison", "m"])
        await _run([_runner(service, breaks_on_poison, lease_s=0.2)], lambda: _status_is(service, batch["id"], "completed"))
        return await service.get("", batch["id"])

    ended = asyncio.run(scenario())
    assert ended["request_counts"] == {"total": 3, "completed": 2, "failed": 1}
    assert runs == {"m": 2, "poison": batch_runner.MAX_LOST}
    [failed] = asyncio.run(_records(service, ended["error_file_id"]))
    assert failed["custom_id"] == "line-1" and failed["response"]["status_code"] == 500
    assert failed["response"]["body"]["error"]["code"] == "batch_line_lost"


def test_a_server_stopping_gives_its_lines_back_without_counting_them_lost(tmp_path):
    service = _service(tmp_path)
    started = asyncio.Event()

    async def slow(owner: str, url: str, body: dict) -> tuple[int, dict]:
        started.set()
        await asyncio.sleep(3600)
        return 200, {}

    async def scenario() -> None:
        await _batch(service, ["m"])
        runner = _runner(service, slow)
        task = asyncio.create_task(runner.run_forever())
        await asyncio.wait_for(started.wait(), 30)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await runner.close()

    asyncio.run(scenario())
    [line] = service.batches.claim("next", 4, 30.0)
    assert line.lost == 0


def test_ended_batches_are_deleted_with_their_output_files(tmp_path):
    service = _service(tmp_path)

    async def scenario() -> tuple[dict, dict]:
        batch = await _batch(service, ["m", "m"])
        with pytest.raises(Exception) as running:
            await service.delete("", batch["id"])
        assert running.value.status_code == 400
        await _run([_runner(service, _answering("m", Counter()))],
                   lambda: _status_is(service, batch["id"], "completed"))
        ended = await service.get("", batch["id"])
        return ended, await service.delete("", batch["id"])

    ended, deleted = asyncio.run(scenario())
    assert deleted == {"id": ended["id"], "object": "batch", "deleted": True}
    for file_id, gone in ((ended["input_file_id"], False), (ended["output_file_id"], True)):
        assert (service.files.get("", file_id) is None) == gone
    with service.batches.database.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(BATCH_LINES)).scalar_one() == 0


def test_an_expired_message_batch_lists_its_lines_as_expired(tmp_path):
    service = _service(tmp_path)

    async def scenario() -> tuple[dict, bytes]:
        batch = await service.message_batches.create("", [
            {"custom_id": "ran", "params": {"model": "a", "max_tokens": 4, "messages": []}},
            {"custom_id": "waited", "params": {"model": "c", "max_tokens": 4, "messages": []}}])

        async def ended() -> bool:
            return (await service.get("", batch["id"], "anthropic"))["processing_status"] == "ended"

        runner = _runner(service, _answering_any(), lambda: {"a"})
        await _run([runner], lambda: _counts_done(service, batch["id"], 1))
        with service.batches.database.begin() as conn:
            conn.execute(sa.update(BATCHES).values(expires_at=0))
        await _run([_runner(service, _answering_any(), lambda: {"a"})], ended)
        pages = await service.message_batches.results("", batch["id"])
        return await service.get("", batch["id"], "anthropic"), b"".join([page async for page in pages])

    body, results = asyncio.run(scenario())
    assert body["request_counts"] == {"processing": 0, "succeeded": 1, "errored": 0, "canceled": 0, "expired": 1}
    lines = {x["custom_id"]: x["result"]["type"] for x in map(json.loads, results.decode().splitlines())}
    assert lines == {"ran": "succeeded", "waited": "expired"}


def _answering_any():
    async def dispatch(owner: str, url: str, body: dict) -> tuple[int, dict]:
        return 200, {"type": "message", "model": body["model"]}
    return dispatch


async def _counts_done(service: BatchService, batch_id: str, n: int) -> bool:
    return service.batches.counts(batch_id)[1] == n


def test_a_handler_that_raises_answers_a_500_body(tmp_path):
    """``server/batch_dispatch.py``: an exception that is not an API error becomes the line's
    500 result in its API's error shape, recorded once."""
    from fastapi import FastAPI

    from glmserve.server.batch_dispatch import dispatcher

    class Broken:
        async def acquire(self, *args, **kwargs):
            raise RuntimeError("the database went away")

    app = FastAPI()
    app.state.model_router, app.state.api_keys = Broken(), ()
    dispatch = dispatcher(app)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    status, error = asyncio.run(dispatch("", "/v1/chat/completions", body))
    assert status == 500 and error["error"]["code"] == "internal_error" and error["error"]["type"] == "server_error"
    status, error = asyncio.run(dispatch("", "/v1/messages", {**body, "max_tokens": 4}))
    assert status == 500 and error["type"] == "error" and error["error"]["type"] == "api_error"


def test_uploads_and_batch_files_are_handled_off_the_event_loop(tmp_path, monkeypatch):
    """Reading, checking and storing an upload, parsing a batch file and writing the output
    files run in worker threads: a big file never stalls the streams on the event loop. The
    UTF-8 check works in pieces, across a character split between them."""
    import threading

    from glmserve.serving.batches import service as batches_module

    service = _service(tmp_path)
    threads: list[str] = []
    real_parse, real_create = batches_module.parse_lines, FileStore.create

    def parse(*args):
        threads.append(threading.current_thread().name)
        return real_parse(*args)

    def create(self, *args):
        threads.append(threading.current_thread().name)
        return real_create(self, *args)

    real_piece = BatchStore.write_piece

    def write_piece(self, *args):
        threads.append(threading.current_thread().name)
        return real_piece(self, *args)

    monkeypatch.setattr(batches_module, "parse_lines", parse)
    monkeypatch.setattr(FileStore, "create", create)
    monkeypatch.setattr(BatchStore, "write_piece", write_piece)

    async def scenario() -> tuple[str, dict]:
        loop_thread = threading.current_thread().name
        batch = await _batch(service, ["m"])
        await _run([_runner(service, _answering("m", Counter()))], lambda: _status_is(service, batch["id"], "completed"))
        split = b"a" * ((1 << 20) - 1) + "\u00e9".encode() + b"\n"  # a 2-byte character across the 1 MiB mark
        return loop_thread, await service.file_service.upload("", "batch", "split.jsonl", split)

    loop_thread, split = asyncio.run(scenario())
    # two uploads, the parse, and the output file's one piece (the error file is empty: none)
    assert len(threads) == 4 and loop_thread not in threads, threads
    assert split["bytes"] == (1 << 20) + 2
    with pytest.raises(Exception) as bad:
        asyncio.run(service.file_service.upload("", "batch", "bad.jsonl", b"a" * (1 << 20) + b"\xff"))
    assert bad.value.status_code == 400


def test_a_batch_of_many_pages_ends_with_every_line_in_its_files_in_order(tmp_path):
    """Results are read a page (1000 lines) at a time: a batch of 2,500 lines, half failed,
    ends with every line in its output or error file, in the input's order, and Anthropic's
    results of one as long come whole."""
    service = _service(tmp_path)
    lines = [(f"r{i}", {"model": "m", "messages": []}) for i in range(2500)]

    def run_all(batch_id: str) -> None:
        service.batches.create("", batch_id, "openai" if batch_id.startswith("batch") else "anthropic",
                               {"status": "in_progress"}, lines)
        for line in service.batches.claim("runner", len(lines), 30.0):
            n = int(line.custom_id[1:])
            service.batches.complete(line.id, "", 200 if n % 2 else 400, {"n": n})

    run_all("batch_many")
    asyncio.run(service.finish_if_done("batch_many"))
    ended = service.batches.body("batch_many")
    assert ended["status"] == "completed" and service.batches.counts("batch_many")[0] == 0  # the lines: in the files
    output, errors = asyncio.run(_records(service, ended["output_file_id"])), \
        asyncio.run(_records(service, ended["error_file_id"]))
    assert [r["custom_id"] for r in output] == [f"r{i}" for i in range(1, 2500, 2)]
    assert [r["response"]["body"]["n"] for r in errors] == list(range(0, 2500, 2))
    run_all("msgbatch_many")
    with service.batches.database.begin() as conn:
        conn.execute(sa.update(BATCHES).values(status="ended", body=json.dumps(
            {"id": "msgbatch_many", "type": "message_batch", "status": "ended", "processing_status": "ended"})))

    encoded_in: set[str] = set()
    real_jsonl = message_batches.jsonl

    def jsonl(records):
        encoded_in.add(threading.current_thread().name)
        return real_jsonl(records)

    async def results() -> list[dict]:
        pages = await service.message_batches.results("", "msgbatch_many")
        return [json.loads(x) for x in b"".join([page async for page in pages]).decode().splitlines()]

    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(message_batches, "jsonl", jsonl)
        assert [(r["custom_id"], r["result"]["type"]) for r in asyncio.run(results())] == [
            (f"r{i}", "succeeded" if i % 2 else "errored") for i in range(2500)]
    assert encoded_in and threading.main_thread().name not in encoded_in  # off the event loop's thread


def test_a_batch_whose_results_pass_its_share_ends_failed_keeping_what_it_stored(tmp_path):
    """The runner records a result that does not fit the key's share as a ``store_full``
    error, starts no further line of that batch, and the batch ends ``failed`` with the reason
    in its ``errors`` and its error file; its results so far are in its output file. An
    Anthropic batch ends with the line ``errored`` and the lines not run ``canceled``."""
    database = open_database(f"sqlite:///{tmp_path / 'state.db'}")
    store = ResponseStore(database, 100.0, 40_000, 20_000)
    service = BatchService(BatchStore(database, store.quota), FileStore(store))

    async def big(owner: str, url: str, body: dict) -> tuple[int, dict]:
        return 200, {"object": "chat.completion", "text": "r" * 3000}

    batch_seen: dict = {}

    async def remember(batch_id: str) -> bool:
        batch_seen.update(await service.get("", batch_id))
        return batch_seen["status"] == "failed"

    async def openai_part() -> dict:
        batch = await _batch(service, ["m"] * 12)
        await _run([_runner(service, big)], lambda: remember(batch["id"]))
        return batch_seen

    ended = asyncio.run(openai_part())
    assert ended["errors"]["data"][0]["code"] == "store_full" and "share of 20000" in ended["errors"]["data"][0]["message"]
    done = ended["request_counts"]["completed"]
    assert 1 <= done < 12
    output = asyncio.run(_records(service, ended["output_file_id"]))
    errors = asyncio.run(_records(service, ended["error_file_id"]))
    assert len(output) == done and errors[0]["response"]["body"]["error"]["code"] == "store_full"
    asyncio.run(service.delete("", ended["id"]))

    async def anthropic_part() -> list[dict]:
        batch = await service.message_batches.create("", [{"custom_id": f"c{i}", "params": {"model": "m"}} for i in range(12)])
        await _run([_runner(service, big)], lambda: _processing_ended(service, batch["id"]))
        pages = await service.message_batches.results("", batch["id"])
        return [json.loads(x) for x in b"".join([p async for p in pages]).decode().splitlines()]

    kinds = Counter(r["result"]["type"] for r in asyncio.run(anthropic_part()))
    assert kinds["succeeded"] >= 1 and kinds["errored"] >= 1 and kinds["canceled"] >= 1
    assert sum(kinds.values()) == 12


async def _processing_ended(service: BatchService, batch_id: str) -> bool:
    return (await service.get("", batch_id, "anthropic"))["processing_status"] == "ended"


def test_batch_lines_reach_the_engine_at_batch_priority_and_routes_at_interactive():
    """The priority is an argument of the services' ``create``: the batch dispatcher passes
    ``BATCH_PRIORITY`` for every API's line, a route the default ``INTERACTIVE_PRIORITY``."""
    from fastapi.testclient import TestClient

    from glmserve.chat import CHATML_TEMPLATE, ChatTemplate
    from glmserve.engine.types import BATCH_PRIORITY, INTERACTIVE_PRIORITY
    from glmserve.server.app import create_app
    from glmserve.server.batch_dispatch import dispatcher
    from glmserve.serving.generation.pipeline import ModelPipeline
    from tests.unit.fakes import FakeEngine, one_model

    engine = FakeEngine()
    app = create_app(one_model(ModelPipeline(engine, "fake", ChatTemplate(CHATML_TEMPLATE))))
    ask = [{"role": "user", "content": "hi"}]
    lines = {"/v1/chat/completions": {"model": "fake", "messages": ask},
             "/v1/completions": {"model": "fake", "prompt": "hi", "max_tokens": 4},
             "/v1/messages": {"model": "fake", "messages": ask, "max_tokens": 4},
             "/v1/responses": {"model": "fake", "input": "hi", "store": False}}
    with TestClient(app) as http:
        for url, body in lines.items():
            assert http.post(url, json=body).status_code == 200
            assert engine.requests[-1].priority == INTERACTIVE_PRIORITY, url
            before = len(engine.requests)
            status, result = http.portal.call(dispatcher(app), "", url, body)
            assert status == 200, result
            assert len(engine.requests) == before + 1 and engine.requests[-1].priority == BATCH_PRIORITY, url


def test_an_idle_runner_looks_at_the_database_only_every_idle_poll_s_or_when_woken(tmp_path):
    """With no batch unfinished, a runner leaves the database alone between looks (``idle_poll_s``),
    not every ``poll_s``: every SQL statement is counted (SQLAlchemy's ``before_cursor_execute``),
    none runs while it is idle, a look is three statements (a claim, one query for the batches
    to end, expired or done, and whether any is left), and it calls no heartbeat with nothing to
    renew. A batch created through its own service wakes it at once,
    and one that another server creates on the same database (no wake here) is found at a later
    look."""
    service, calls = _service(tmp_path), Counter()
    statements: list[str] = []
    sa.event.listen(service.batches.database, "before_cursor_execute",
                    lambda conn, cursor, statement, *args: statements.append(statement))
    heartbeats: list[list[int]] = []
    heartbeat = service.batches.heartbeat

    def counted_heartbeat(runner: str, line_ids: list[int]) -> None:
        heartbeats.append(list(line_ids))
        heartbeat(runner, line_ids)

    service.batches.heartbeat = counted_heartbeat

    def unfinished_queries() -> int:
        return sum("FROM batches" in s and "batches.status IN" in s and "expires_at" not in s for s in statements)

    async def looked(n: int) -> bool:
        return unfinished_queries() >= n

    async def scenario() -> None:
        activity = Activity()
        runner = BatchRunner(service, _answering("m", calls), lambda: 4, activity, poll_s=0.01, idle_poll_s=3600)
        task = asyncio.create_task(runner.run_forever())
        try:
            await _until(lambda: looked(1))
            await asyncio.sleep(0.05)  # the look's own statements done
            first_look, mark = list(statements), len(statements)
            await asyncio.sleep(0.5)  # fifty poll_s periods
            for _ in range(5):  # interactive requests come and go: each wakes the runner
                leave = activity.enter()
                activity.changed.set()
                await asyncio.sleep(0.03)
                leave()
                await asyncio.sleep(0.03)
            assert statements[mark:] == []  # idle: no statement at all
            assert len(first_look) <= 3, first_look  # a look: a claim, the batches to end, whether any is left
            assert sum("expires_at <=" in s for s in first_look) == 1, first_look  # expired ones in the same query
            assert [b for b in heartbeats if not b] == []  # no heartbeat round trip with nothing to renew
            batch = await _batch(service, ["m", "m"])  # the service wakes its runner
            await _until(lambda: _status_is(service, batch["id"], "completed"))
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await runner.close()
        assert sum(calls.values()) == 2
        other = _service(tmp_path)  # another server's, on the same database
        runner = BatchRunner(service, _answering("m", calls), lambda: 4, Activity(), poll_s=0.01, idle_poll_s=0.2)
        task = asyncio.create_task(runner.run_forever())
        try:
            seen = unfinished_queries()
            await _until(lambda: looked(seen + 1))  # the first look: nothing unfinished, idle
            batch = await _batch(other, ["m"])
            await _until(lambda: _status_is(service, batch["id"], "completed"))
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await runner.close()
        assert [b for b in heartbeats if not b] == []

    asyncio.run(scenario())


def test_a_line_nested_too_deep_is_an_invalid_line_not_a_500():
    """A JSONL line of 100,000 nested arrays (issue 91, 7: the parser's RecursionError was a 500):
    the line's ``invalid_json_line`` error, as for any line that does not parse."""
    from glmserve.serving.batches.files import parse_lines

    deep = "[" * 100_000 + "]" * 100_000
    line = '{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"x": ' + deep + "}}"
    requests, errors = parse_lines([line.encode()], "/v1/chat/completions")
    assert requests == [] and [(e["code"], e["line"]) for e in errors] == [("invalid_json_line", 1)]
