"""The state stores on PostgreSQL, driven directly (no server): replicas on hosts whose clocks
disagree agree on claim leases and heartbeats, because every such time is the database's
(``state.tables.db_now``); concurrent claims take different lines."""

from __future__ import annotations

import concurrent.futures
import time
import uuid

import psycopg
import pytest

from glmserve.state import BatchStore, ResponseStore, open_database
from glmserve.state import responses as responses_module


@pytest.fixture()
def database(postgres):
    name = f"state_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres.url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    engine = open_database(postgres.url.rsplit("/", 1)[0] + f"/{name}")
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
