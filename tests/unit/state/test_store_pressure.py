"""The state under pressure (``state/quota.py``, ``state/batches.py``'s builds, the migrations):
a full store never deletes a key's data while that key is within its share, deletions run in
pages, batch files are written in short transactions while other writes go on, and the
migrations run on an SQLite without ``DROP COLUMN`` and roll back when they fail part way.
PostgreSQL: ``tests/e2e/test_state_postgres.py``."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sqlite3
import threading
import time

import pytest
import sqlalchemy as sa

from glmserve.serving.batches.runner import Activity, BatchRunner
from glmserve.serving.batches.service import BatchService
from glmserve.state import BatchStore, ConversationStore, FileStore, ResponseStore, StoreFull, open_database
from glmserve.state.quota import TOTAL, owner_bytes, stored_bytes
from glmserve.state.tables import BATCH_LINES, BATCHES, RESPONSES, USAGE, dumps
from tests.state_checks import crash_in, revisions, seed, upgrade, usage_agrees


def _store(tmp_path, max_bytes: int, per_key: int | None = None, keys: int = 1) -> ResponseStore:
    return ResponseStore(open_database(f"sqlite:///{tmp_path / 'state.db'}"), 3600.0, max_bytes, per_key, keys)


def _respond(store: ResponseStore, owner: str, n: int, size: int = 1000, prefix: str = "") -> list[str]:
    ids = [f"resp_{owner}{prefix}{i}" for i in range(n)]
    for rid in ids:
        store.put(owner, {"id": rid, "status": "completed", "text": "x" * size}, [])
    return ids


def _kept(store: ResponseStore, owner: str, ids: list[str]) -> int:
    return sum(store.get(owner, rid) is not None for rid in ids)


def _batch_of(service: BatchService, owner: str, batch_id: str, n: int, size: int) -> None:
    """An OpenAI batch of ``n`` lines whose results are ``size`` bytes each, all run."""
    body = {"id": batch_id, "object": "batch", "status": "in_progress", "errors": None, "endpoint": "/v1/chat/completions"}
    service.batches.create(owner, batch_id, "openai", body, [(f"r{i}", {"model": "m"}) for i in range(n)])
    for line in service.batches.claim("runner", n, 30.0, ["m"]):
        service.batches.complete(line.id, owner, 200, {"text": "y" * size})


def test_a_batch_whose_output_passes_the_bound_leaves_every_other_keys_responses(tmp_path):
    """The issue's case: two keys, ``--store-max-bytes 60000``. Key a stores 8 responses; key
    b's 80-line batch, its lines all running, passes b's share: it stops (``failed``, the reason
    in its ``errors``), each line answered once (a result, or ``store_full`` within the room the
    line held since the batch was made: b stays within its share), and b's next stored response
    still leaves all 8 of a's."""
    store = _store(tmp_path, 60_000, keys=2)
    service = BatchService(BatchStore(store.database, store.quota), FileStore(store))
    mine = _respond(store, "a", 8, 2000)
    body = {"id": "batch_b", "object": "batch", "status": "in_progress", "errors": None,
            "endpoint": "/v1/chat/completions", "request_counts": {"total": 80, "completed": 0, "failed": 0}}
    service.batches.create("b", "batch_b", "openai", body, [(f"r{i}", {"model": "m"}) for i in range(80)])
    full = None
    for line in service.batches.claim("runner", 80, 30.0):  # all running at once: each ends after the stop
        try:
            service.batches.complete(line.id, "b", 200, {"text": "y" * 1500})
        except StoreFull as exc:
            if full is None:
                full = str(exc)
                asyncio.run(service.stop_full("batch_b", full))
    assert full is not None and "share of 30000" in full
    with store.database.connect() as conn:  # the lines answered store_full within the room they held
        assert owner_bytes(conn, "b") <= 30_000
    _respond(store, "b", 1, 2000)
    assert _kept(store, "a", mine) == 8
    asyncio.run(service.finish_if_done("batch_b"))  # cancelling with nothing running: it ends now
    ended = service.batches.body("batch_b")
    assert ended["status"] == "failed" and ended["errors"]["data"][0]["code"] == "store_full"
    records = [json.loads(line) for key in ("output_file_id", "error_file_id")
               for line in b"".join(service.files.pieces(ended[key])).splitlines()]
    assert sorted(r["custom_id"] for r in records) == sorted(f"r{i}" for i in range(80))  # each answered once
    assert any(r["response"] and r["response"]["status_code"] == 200 for r in records)  # what it stored is kept
    assert _kept(store, "a", mine) == 8
    with store.database.connect() as conn:
        assert owner_bytes(conn, "b") <= 30_000 + 2100 and stored_bytes(conn) <= 60_000
    usage_agrees(store.database)


def test_eviction_takes_from_keys_over_their_share_first_oldest_first(tmp_path):
    """With an explicit share bigger than the total's half (overcommitted), a key over its
    share loses its oldest responses to another key's write, and only down to its share; a key
    within its share loses nothing."""
    store = _store(tmp_path, 40_000, per_key=30_000)
    a = _respond(store, "a", 14, 2000)  # ~28 kB: within a's share
    c = _respond(store, "c", 5, 2000)  # ~10 kB
    b = _respond(store, "b", 6, 2000)  # the total passes 40 kB: a and c are within their shares, so b's own go
    assert _kept(store, "a", a) == 14 and _kept(store, "c", c) == 5 and _kept(store, "b", b) == 1
    with store.database.connect() as conn:  # past the total by b's one response at most (overcommitted)
        assert stored_bytes(conn) <= 40_000 + 2100 and owner_bytes(conn, "a") > 27_000
    c2 = _respond(store, "c", 10, 2000, "late")  # c passes its share? no: the total; b is not over, c's own go
    assert _kept(store, "a", a) == 14 and _kept(store, "b", b) == 1 and _kept(store, "c", c2) >= 1
    more = _respond(store, "a", 2, 2000, "late")  # a passes its own share: a's own oldest go, no one else's
    assert _kept(store, "a", more) == 2 and _kept(store, "a", a[:2]) == 0 and _kept(store, "b", b) == 1
    usage_agrees(store.database)


def test_one_key_filling_the_store_leaves_another_key_able_to_upload(tmp_path):
    """At the defaults (a share per key: the total over the number of keys), key a's responses
    filling the store do not lock key b out: b's upload makes room from a's oldest responses,
    a key past its share."""
    store = _store(tmp_path, 50_000, keys=2)
    files = FileStore(store)
    conversations = ConversationStore(store)
    with store.database.begin() as conn:  # a's responses from before the shares: 48 kB of the 50
        for i in range(24):
            text = dumps({"id": f"resp_a{i}", "status": "completed", "text": "x" * 1970})
            conn.execute(sa.insert(RESPONSES).values(id=f"resp_a{i}", owner="a", created_at=time.time() + i,
                                                     expires_at=time.time() + 3600, status="completed", body=text,
                                                     input_items="[]", size=len(text) + 2, heartbeat_at=None))
        conn.execute(sa.update(USAGE).where(USAGE.c.owner == TOTAL).values(bytes=sum(
            int(s) for (s,) in conn.execute(sa.select(RESPONSES.c.size)))))
        conn.execute(sa.insert(USAGE).values(owner="a", bytes=sa.select(USAGE.c.bytes).where(
            USAGE.c.owner == TOTAL).scalar_subquery()))
    assert files.create("b", "file-b", "batch", "b.jsonl", b"z" * 20_000)["bytes"] == 20_000
    conversations.create("b", "conv_b", {}, [{"id": "msg_1", "text": "v" * 2000}])
    with pytest.raises(StoreFull, match=r"share of 25000 \(--store-max-bytes / 2 keys"):
        files.create("b", "file-b2", "batch", "b.jsonl", b"z" * 5_000)  # b's own share is full now
    with store.database.connect() as conn:
        assert stored_bytes(conn) <= 50_000 and owner_bytes(conn, "a") >= 25_000 - 2000
    usage_agrees(store.database)


def _old_sqlite_limits(engine) -> None:
    """The parameters one statement may take on stock SQLite before 3.32 (999; 32,766 since,
    where Debian's build takes 250,000)."""
    sa.event.listen(engine, "connect",
                    lambda dbapi, record: dbapi.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 999))
    engine.dispose()


def test_forty_thousand_stored_responses_are_trimmed_without_error(tmp_path):
    """More ids than SQLite takes parameters in one statement are deleted in pages."""
    store = _store(tmp_path, 100_000_000)
    _old_sqlite_limits(store.database)
    now = time.time()
    with store.database.begin() as conn:
        conn.execute(sa.insert(RESPONSES), [
            {"id": f"resp_{i}", "owner": "a", "created_at": now + i * 1e-3, "expires_at": now + 3600,
             "status": "completed", "body": "{}", "input_items": "[]", "size": 100, "heartbeat_at": None}
            for i in range(40_000)])
        conn.execute(sa.update(USAGE).where(USAGE.c.owner == TOTAL).values(bytes=4_000_000))
        conn.execute(sa.insert(USAGE).values(owner="a", bytes=4_000_000))
    small = ResponseStore(store.database, 3600.0, 5_000)
    small.put("a", {"id": "resp_new", "status": "completed"}, [])
    assert small.get("a", "resp_new") is not None
    with store.database.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(RESPONSES)).scalar_one() <= 50
    assert small.purge(now + 7200) >= 1
    usage_agrees(store.database)


def test_a_big_output_file_is_written_while_responses_are_stored(tmp_path):
    """A 50,000-line batch's files are written a piece per transaction: responses stored
    meanwhile from other threads all succeed (none waits out the busy timeout), and every
    line is in the files once."""
    store = _store(tmp_path, 1 << 30)
    service = BatchService(BatchStore(store.database, store.quota), FileStore(store))
    n = 50_000
    body = {"id": "batch_big", "object": "batch", "status": "in_progress", "errors": None,
            "endpoint": "/v1/chat/completions"}
    service.batches.create("a", "batch_big", "openai", body, [(f"r{i}", {"model": "m"}) for i in range(n)])
    with store.database.begin() as conn:  # every line run (one statement, not 50,000)
        conn.execute(sa.update(BATCH_LINES).values(done=True, status_code=200, result='{"ok":true}',
                                                   size=BATCH_LINES.c.size + 11))
        conn.execute(sa.update(USAGE).where(USAGE.c.owner.in_(["a", TOTAL])).values(bytes=USAGE.c.bytes + n * 11))
    errors: list[BaseException] = []
    stored = 0
    stop = threading.Event()
    events: list[str] = []  # "piece" as each piece's transaction commits, "put" as each response is stored
    real_piece = BatchStore.write_piece

    def piece(self, *args):
        result = real_piece(self, *args)
        events.append("piece")
        return result

    def writer(owner: str) -> None:
        nonlocal stored
        i = 0
        while not stop.is_set():
            try:
                store.put(owner, {"id": f"resp_{owner}{i}", "status": "completed", "text": "t" * 500}, [])
                stored += 1
                events.append("put")
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)
            i += 1

    threads = [threading.Thread(target=writer, args=(owner,)) for owner in ("b", "c")]
    for thread in threads:
        thread.start()
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(BatchStore, "write_piece", piece)
            asyncio.run(service.finish_if_done("batch_big"))
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert errors == [] and stored > 0
    # a transaction per piece, and responses stored between them (one long transaction would
    # hold every store.put until it ends)
    first, last = events.index("piece"), len(events) - 1 - events[::-1].index("piece")
    assert events.count("piece") > 1 and "put" in events[first:last]
    ended = service.batches.body("batch_big")
    assert ended["status"] == "completed" and ended["request_counts"]["completed"] == n
    lines = b"".join(service.files.pieces(ended["output_file_id"])).splitlines()
    import json
    assert [json.loads(line)["custom_id"] for line in lines] == [f"r{i}" for i in range(n)]
    assert service.batches.counts("batch_big")[0] == 0  # the lines are in the file, not held twice
    usage_agrees(store.database)


def test_a_build_whose_server_stopped_is_taken_over(tmp_path, monkeypatch):
    """A builder that stops after some pieces leaves the batch ``finalizing``; another server
    takes the build over once it is ``BUILD_LEASE_S`` old and finishes it from the next line,
    every line in the file once."""
    from glmserve.serving.batches import service as service_module
    from glmserve.state import batches as batches_module

    store = _store(tmp_path, 1 << 30)
    service = BatchService(BatchStore(store.database, store.quota), FileStore(store))
    monkeypatch.setattr(service_module, "PIECE_LINES", 10)
    _batch_of(service, "a", "batch_x", 35, 10)
    real, calls = BatchStore.write_piece, []

    def dies_on_third(self, *args):
        calls.append(1)
        if len(calls) == 3:
            raise SystemExit("the server died")
        return real(self, *args)

    monkeypatch.setattr(BatchStore, "write_piece", dies_on_third)
    with pytest.raises(SystemExit):
        asyncio.run(service.finish_if_done("batch_x"))
    monkeypatch.setattr(BatchStore, "write_piece", real)
    assert service.batches.body("batch_x")["status"] == "finalizing"
    asyncio.run(service.finish_if_done("batch_x"))  # not yet stale: left alone
    assert service.batches.body("batch_x")["status"] == "finalizing"
    with store.database.begin() as conn:
        conn.execute(sa.update(BATCHES).values(build_at=BATCHES.c.build_at - 3600))
    assert [b for b, _ in service.batches.ready(60.0, 10)] == ["batch_x"]
    asyncio.run(service.finish_if_done("batch_x"))
    ended = service.batches.body("batch_x")
    assert ended["status"] == "completed" and batches_module.FINALIZING not in ended.values()
    import json
    lines = b"".join(service.files.pieces(ended["output_file_id"])).splitlines()
    assert [json.loads(line)["custom_id"] for line in lines] == [f"r{i}" for i in range(35)]
    assert service.files.get("a", ended["output_file_id"])["bytes"] == sum(len(x) + 1 for x in lines)
    usage_agrees(store.database)


def test_a_sweep_of_thousands_of_waiting_batches_is_one_query_and_heartbeats_go_on_while_the_loop_is_stuck(
        tmp_path):
    """5,000 batches wait on a model no server has: the runner's look for batches to end is
    one query that returns none of them, and the claims of a line running here are renewed on
    their own timer while a pass of the loop is stuck (a slow end of another batch): three
    renewals come while it is stuck (a renewal made by the loop would never come)."""
    store = _store(tmp_path, 1 << 30)
    service = BatchService(BatchStore(store.database, store.quota), FileStore(store))
    now = time.time()
    with store.database.begin() as conn:
        conn.execute(sa.insert(BATCHES), [{"id": f"batch_bogus{i}", "owner": "a", "created_at": now, "api": "openai",
                                           "status": "in_progress", "body": "{}", "expires_at": now + 3600}
                                          for i in range(5000)])
        conn.execute(sa.insert(BATCH_LINES), [{"batch_id": f"batch_bogus{i}", "line_no": 0, "custom_id": "r",
                                               "request": '{"model":"bogus"}', "done": False, "model": "bogus",
                                               "size": 17} for i in range(5000)])
    assert service.batches.ready(60.0, 20) == []
    _batch_of(service, "a", "batch_done", 1, 10)  # ended: its end (stuck below) blocks the loop
    service.batches.create("a", "batch_live", "openai", {"status": "in_progress", "endpoint": "/v1/chat/completions"},
                           [("r", {"model": "m"})])
    beats: list[float] = []
    real_beat = service.batches.heartbeat
    service.batches.heartbeat = lambda runner, ids: (beats.append(time.monotonic()), real_beat(runner, ids))
    ended: list[str] = []
    release = asyncio.Event()

    async def stuck_end(batch_id: str, expire: bool = False) -> None:
        ended.append(batch_id)
        await release.wait()

    service.finish_if_done = stuck_end
    started = asyncio.Event()

    async def dispatch(owner: str, url: str, body: dict) -> tuple[int, dict]:
        started.set()
        await asyncio.sleep(3600)
        return 200, {}

    async def scenario() -> None:
        runner = BatchRunner(service, dispatch, lambda: 4, Activity(), poll_s=0.05, models=lambda: ["m"], lease_s=0.6)
        task = asyncio.create_task(runner.run_forever())
        try:
            await asyncio.wait_for(started.wait(), 30)
            while not ended:  # the loop is stuck ending batch_done from here until release
                await asyncio.sleep(0.01)
            stuck_beats = len(beats)
            while len(beats) < stuck_beats + 3:
                assert not release.is_set()
                await asyncio.sleep(0.05)
        finally:
            release.set()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await runner.close()

    asyncio.run(asyncio.wait_for(scenario(), 60))
    assert ended == ["batch_done"]  # none of the 5,000 waiting batches was looked at one by one


def test_a_claim_never_hands_back_a_line_running_here(tmp_path):
    store = _store(tmp_path, 1 << 30)
    batches = BatchStore(store.database, store.quota)
    batches.create("a", "batch_1", "openai", {"status": "in_progress"}, [("r0", {}), ("r1", {})])
    first = batches.claim("me", 1, 30.0)
    time.sleep(0.01)
    again = batches.claim("me", 2, 0.0, running=[first[0].id])  # every claim is stale at lease 0
    assert [line.custom_id for line in again] == ["r1"]


def test_claims_share_the_lines_out_among_the_keys(tmp_path):
    """Issue 91, 5: key a's big batch came first, key b's after; each claim gives each key its
    share (the lines were handed out oldest first, so b's batch waited behind all of a's), and
    what one key does not use goes to the other."""
    store = _store(tmp_path, 1 << 30)
    batches = BatchStore(store.database, store.quota)
    batches.create("a", "batch_a", "openai", {"status": "in_progress"}, [(f"a{i}", {}) for i in range(50)])
    batches.create("b", "batch_b", "openai", {"status": "in_progress"}, [(f"b{i}", {}) for i in range(3)])
    first = batches.claim("me", 4, 30.0)
    assert sorted(line.custom_id for line in first) == ["a0", "a1", "b0", "b1"]
    second = batches.claim("me", 4, 30.0)
    assert sorted(line.custom_id for line in second) == ["a2", "a3", "a4", "b2"]  # b's last line, a the rest
    assert [line.custom_id for line in batches.claim("me", 3, 30.0)] == ["a5", "a6", "a7"]  # one key left: all its


def test_conversation_items_are_never_orphaned_and_a_deleted_background_response_stays_deleted(tmp_path):
    """Items added while their conversation is deleted (another thread) are refused or deleted
    with it; a background run's later state does not bring back a response deleted meanwhile."""
    store = _store(tmp_path, 1 << 30)
    conversations = ConversationStore(store)
    for round_ in range(20):
        conversations.create("a", f"conv_{round_}", {}, [])
        adding = threading.Thread(target=lambda r=round_: [conversations.add_items(
            "a", f"conv_{r}", [{"id": f"msg_{i}", "text": "x"}]) for i in range(20)])
        adding.start()
        conversations.delete("a", f"conv_{round_}")
        adding.join()
    with store.database.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM conversation_items")).scalar_one() == 0
    usage_agrees(store.database)
    store.put("a", {"id": "resp_bg", "status": "queued", "background": True}, [], True, False)
    assert store.delete("a", "resp_bg")
    assert not store.put("a", {"id": "resp_bg", "status": "completed", "background": True}, [], True, True)
    assert store.get("a", "resp_bg") is None


def test_a_state_left_readable_by_others_is_made_private(tmp_path, caplog):
    """``--state-dir`` and the database file, left 0755/0644 by an earlier version, are made
    0700/0600 with a log line; a folder the user named for the file is left as it is."""
    folder = tmp_path / "state"
    folder.mkdir(mode=0o755)
    os.chmod(folder, 0o755)
    path = folder / "state.db"
    open_database(f"sqlite:///{path}").dispose()
    os.chmod(path, 0o644)
    os.chmod(folder, 0o755)
    with caplog.at_level(logging.WARNING, "glmserve.state"):
        open_database(f"sqlite:///{path}", private_folder=True).dispose()
    assert os.stat(path).st_mode & 0o777 == 0o600 and os.stat(folder).st_mode & 0o777 == 0o700
    assert "readable by others" in caplog.text
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o755)
    open_database(f"sqlite:///{shared / 'state.db'}").dispose()
    assert os.stat(shared).st_mode & 0o777 == 0o755 and os.stat(shared / "state.db").st_mode & 0o777 == 0o600


# --- migrations -------------------------------------------------------------------------

def _no_drop_column(engine) -> None:
    """SQLite before 3.35 (RHEL 9, Debian 11: 3.34) has no ``ALTER TABLE ... DROP COLUMN``: refuse it."""
    def refuse(conn, cursor, statement, *args) -> None:
        if "DROP COLUMN" in statement.upper():
            raise sa.exc.OperationalError(statement, (), Exception('near "DROP": syntax error'))
    sa.event.listen(engine, "before_cursor_execute", refuse)


@pytest.mark.parametrize("start", ["0001", "0002", "0003", "0004", "0005", "0006"])
def test_the_migrations_run_without_drop_column_from_each_revision(tmp_path, monkeypatch, start):
    """From each earlier revision (with a response, a file and a batch stored) to the newest
    on an SQLite that has no ``DROP COLUMN``; ``store_usage`` then agrees with the tables."""
    url = f"sqlite:///{tmp_path / 'state.db'}"
    upgrade(url, start)
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        seed(conn, start)
    engine.dispose()
    real = sa.create_engine

    def old_sqlite(*args, **kwargs):
        engine = real(*args, **kwargs)
        _no_drop_column(engine)
        _old_sqlite_limits(engine)
        return engine

    monkeypatch.setattr(sa, "create_engine", old_sqlite)
    store = ResponseStore(open_database(url), 3600.0, 1 << 20)
    assert store.get("k", "resp_1") is not None
    usage_agrees(store.database)
    if start >= "0003":
        assert b"".join(FileStore(store).pieces("file-1")) == (b"{}\n" if start < "0006" else b"")


@pytest.mark.parametrize("revision", ["0002", "0003", "0004", "0005", "0006", "0007"])
def test_a_crash_inside_a_migration_leaves_the_database_as_it_was(tmp_path, monkeypatch, revision):
    """A migration that fails after its statements ran (the process dies before its revision
    is written) rolls back whole: the next start migrates from the revision before it."""
    url = f"sqlite:///{tmp_path / 'state.db'}"
    upgrade(url, revisions()[revisions().index(revision) - 1])
    with monkeypatch.context() as patched:
        crash_in(patched, revision)
        with pytest.raises(Exception, match="died here"):
            open_database(url)
    store = ResponseStore(open_database(url), 3600.0, 1 << 20)
    store.put("k", {"id": "resp_1", "status": "completed"}, [])
    assert store.get("k", "resp_1") is not None


def test_a_write_reads_running_totals_not_whole_tables(tmp_path):
    """A stored response, an upload and a conversation item each read the owners' running
    totals (``store_usage``), and the first statement of each takes the store's write lock
    (the ``TOTAL`` row) before anything is read: no ``sum`` over a table, no size read
    unlocked."""
    store = _store(tmp_path, 1 << 30, keys=2)
    _respond(store, "a", 3)
    statements: list[str] = []
    sa.event.listen(store.database, "before_cursor_execute",
                    lambda conn, cursor, statement, *args: statements.append(" ".join(statement.split())))
    for write in (lambda: _respond(store, "a", 1, prefix="more"),
                  lambda: FileStore(store).create("a", "file-1", "batch", "a.jsonl", b"{}\n"),
                  lambda: ConversationStore(store).create("a", "conv_1", {}, [{"id": "msg_1"}])):
        statements.clear()
        write()
        assert not any("sum(" in s.lower() for s in statements), statements
        first = next(s for s in statements if not s.startswith("INSERT INTO file_chunks"))
        assert first.startswith("UPDATE store_usage SET bytes") and "store_usage.owner = ?" in first, statements


def test_the_migrations_and_stores_run_on_debian_11s_sqlite(tmp_path):
    """Debian 11's and RHEL 9's SQLite, 3.34.1 (no ``DROP COLUMN``; pysqlite3 built against it
    by ``make old-sqlite``, which ``make test`` runs): the migrations from each earlier
    revision, a crash inside the newest, and writes of every store (``tests/old_sqlite_check.py``,
    in a process of its own)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    site = root / "build" / "old-sqlite" / "site"
    assert (site / "pysqlite3").is_dir(), "Debian 11's SQLite is not built: run make old-sqlite (make test does)"
    done = subprocess.run([sys.executable, str(root / "tests" / "old_sqlite_check.py"), str(tmp_path)],
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(root)])},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok 3.34.1", done.stdout + done.stderr


def test_a_key_cannot_pass_its_share_with_running_runs_or_a_long_chain(tmp_path):
    """Issue 91, 3. Background runs still going are never evicted, so a new one that does not
    fit its key's share is refused before it runs (``StoreFull``; the route's 400), while an
    ended response is still written (trimmed around). A response whose input items alone (a
    continued chain's whole history, copied into each response) pass the share is a 400
    before anything is generated."""
    from glmserve.protocol.errors import APIError
    from glmserve.protocol.responses import ResponsesRequest
    from glmserve.serving.responses.stored import ResponseStorage

    store = _store(tmp_path, 20_000, keys=2)  # a share of 10,000 bytes
    for i in range(2):
        assert store.put("a", {"id": f"resp_run{i}", "status": "queued", "background": True, "text": "x" * 4000}, [],
                         refusable=True)
    with pytest.raises(StoreFull, match="for this API key"):
        store.put("a", {"id": "resp_run2", "status": "queued", "background": True, "text": "x" * 4000}, [],
                  refusable=True)
    assert store.get("a", "resp_run2") is None and owner_bytes_of(store, "a") <= 10_000
    assert store.put("a", {"id": "resp_done", "status": "completed", "text": "x" * 4000}, [])  # written, never refused

    storage = ResponseStorage(store)
    store.put("b", {"id": "resp_b1", "status": "completed", "output": []}, [{"type": "message", "role": "user",
                                                                             "content": "y" * 6000}])

    class NotCalled:
        async def create(self, *args, **kwargs):
            raise AssertionError("generated although the response could not be kept")

    request = ResponsesRequest(model="m", input=[{"type": "message", "role": "user", "content": "z" * 5000}],
                               previous_response_id="resp_b1")
    with pytest.raises(APIError) as refused:
        asyncio.run(storage.create(NotCalled(), request, "b"))
    assert (refused.value.status_code, refused.value.code) == (400, "store_full")


def owner_bytes_of(store: ResponseStore, owner: str) -> int:
    with store.database.connect() as conn:
        return owner_bytes(conn, owner)
