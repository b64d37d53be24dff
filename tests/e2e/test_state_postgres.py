"""The state stores on PostgreSQL, driven directly (no server): replicas on hosts whose clocks
disagree agree on claim leases and heartbeats, because every such time is the database's
(``state.tables.db_now``); concurrent claims take different lines; the migrations from each
earlier revision, and after a crash inside one; the size bounds under concurrent writes, and
one key's batch never deleting another key's responses."""

from __future__ import annotations

import concurrent.futures
import threading
import time
import uuid

import psycopg
import pytest
import sqlalchemy as sa

from glmserve.state import BatchStore, ResponseStore, open_database
from glmserve.state import responses as responses_module


@pytest.fixture()
def database(postgres):
    engine = open_database(_fresh(postgres))
    yield engine
    engine.dispose()


def _skewed(monkeypatch, seconds: float) -> None:
    """This host's clock ``seconds`` ahead (the other replica's host)."""
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + seconds)


def test_a_host_whose_clock_runs_ahead_does_not_take_live_claims(database, monkeypatch):
    store = BatchStore(database)
    store.create("", "batch_1", "openai", {"status": "in_progress"}, [(f"l{i}", {"model": "m"}) for i in range(4)])
    held = store.claim("host-a", 2, lease_s=30.0)
    assert len(held) == 2
    _skewed(monkeypatch, 45.0)  # host B: 45 s ahead, past the 30 s lease by its own clock
    taken = store.claim("host-b", 4, lease_s=30.0)
    assert {line.id for line in taken}.isdisjoint(line.id for line in held) and len(taken) == 2
    assert store.counts("batch_1")[3] == 4  # all four in flight, by the database's clock


def test_a_host_whose_clock_runs_ahead_does_not_fail_a_live_run(database, monkeypatch):
    from glmserve.serving.responses.stored import LOST_AFTER_S, ResponseStorage

    store = ResponseStore(database, 3600.0, 1 << 20)
    store.put("k", {"id": "resp_live", "status": "in_progress", "background": True}, [])
    _skewed(monkeypatch, LOST_AFTER_S + 30)
    assert ResponseStorage(store)._lost("resp_live", store.get("k", "resp_live")) is False
    monkeypatch.setattr(responses_module, "db_now", lambda conn: time.time())  # as before: each host's own clock
    assert ResponseStorage(store)._lost("resp_live", store.get("k", "resp_live")) is True


def test_replicas_claiming_at_once_take_different_lines(database):
    store = BatchStore(database)
    store.create("", "batch_2", "openai", {"status": "in_progress"}, [(f"l{i}", {"model": "m"}) for i in range(60)])
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        claims = list(pool.map(lambda r: [line.id for line in store.claim(f"r{r}", 10, 30.0)], range(6)))
    ids = [i for claim in claims for i in claim]
    assert len(ids) == len(set(ids)) == 60


def _fresh(postgres) -> str:
    name = f"state_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres.url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return postgres.url.rsplit("/", 1)[0] + f"/{name}"


@pytest.mark.parametrize("start", ["0001", "0002", "0003", "0004", "0005", "0006"])
def test_the_migrations_run_from_each_revision_and_roll_back_a_crash(postgres, monkeypatch, start):
    """From an earlier revision (a response and a file stored), a migration that fails part
    way leaves the database as it was, and the next start migrates to the newest, with
    ``store_usage`` agreeing with the tables."""
    from glmserve.state import FileStore, sqlalchemy_url
    from tests.state_checks import crash_in, revisions, seed, upgrade, usage_agrees

    url = _fresh(postgres)
    upgrade(sqlalchemy_url(url), start)
    engine = sa.create_engine(sqlalchemy_url(url))
    with engine.begin() as conn:
        seed(conn, start)
    engine.dispose()
    with monkeypatch.context() as patched:
        crash_in(patched, revisions()[-1])
        with pytest.raises(Exception, match="died here"):
            open_database(url)
    engine = sa.create_engine(sqlalchemy_url(url))
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar_one() == start
    engine.dispose()
    store = ResponseStore(open_database(url), 3600.0, 1 << 20)
    assert store.get("k", "resp_1") is not None
    usage_agrees(store.database)
    if start >= "0003":
        assert b"".join(FileStore(store).pieces("file-1")) == (b"{}\n" if start < "0006" else b"")


def test_uploads_at_once_cannot_both_pass_a_bound(database):
    """Each of eight uploads fits alone, two do not: the sizes are read under the store's lock
    (the ``TOTAL`` row), so exactly one per share passes, whatever their order."""
    from glmserve.state import FileStore, StoreFull
    from tests.state_checks import usage_agrees

    files = FileStore(ResponseStore(database, 3600.0, 100_000, 60_000))
    barrier = threading.Barrier(8)

    def upload(i: int) -> bool:
        barrier.wait()
        try:
            files.create("k", f"file-{i}", "batch", "a.jsonl", b"z" * 40_000)
            return True
        except StoreFull:
            return False

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        assert sum(pool.map(upload, range(8))) == 1
    usage_agrees(database)


def test_a_batch_past_its_share_leaves_another_keys_responses_and_long_item_ids_are_kept(database):
    """The issue's case on PostgreSQL (two keys, 60,000 bytes): b's batch results stop at b's
    share; a's 8 responses stay. A conversation item id of 200 characters is kept."""
    from glmserve.state import ConversationStore, StoreFull
    from tests.state_checks import usage_agrees

    store = ResponseStore(database, 3600.0, 60_000, None, 2)
    for i in range(8):
        store.put("a", {"id": f"resp_a{i}", "status": "completed", "text": "x" * 2000}, [])
    batches = BatchStore(database, store.quota)
    batches.create("b", "batch_b", "openai", {"status": "in_progress"}, [(f"r{i}", {"model": "m"}) for i in range(80)])
    with pytest.raises(StoreFull, match="share of 30000"):
        for line in batches.claim("runner", 80, 30.0):
            batches.complete(line.id, "b", 200, {"text": "y" * 1500})
    store.put("b", {"id": "resp_b", "status": "completed", "text": "x" * 2000}, [])
    assert all(store.get("a", f"resp_a{i}") is not None for i in range(8))
    conversations = ConversationStore(store)
    conversations.create("a", "conv_1", {}, [])
    long_id = "msg_" + "x" * 196
    assert conversations.add_items("a", "conv_1", [{"id": long_id, "type": "message"}])
    assert conversations.item("a", "conv_1", long_id) == {"id": long_id, "type": "message"}
    usage_agrees(database)
