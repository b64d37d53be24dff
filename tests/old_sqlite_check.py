"""Run in a subprocess by ``tests/unit/state/test_store_pressure.py``, with ``build/old-sqlite/site``
on ``sys.path`` (``make old-sqlite``): the migrations from each earlier revision, a crash inside
the newest, and the stores' writes, on Debian 11's SQLite 3.34.1 (pysqlite3 built against it),
which has no ``DROP COLUMN``. (pysqlite3 has no ``setlimit``: the 999 parameters a statement
took before SQLite 3.32 are checked on the interpreter's own module, in the test file.)

    python tests/old_sqlite_check.py FOLDER
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pysqlite3.dbapi2 as old_sqlite
import sqlalchemy as sa

assert old_sqlite.sqlite_version == "3.34.1", old_sqlite.sqlite_version
_real_create_engine = sa.create_engine


def _old_engine(url, *args, **kwargs):
    """Every SQLite engine made (the state's, the migrations', the tests') on the old library."""
    if str(url).startswith("sqlite"):
        kwargs["module"] = old_sqlite
    return _real_create_engine(url, *args, **kwargs)


sa.create_engine = _old_engine

from glmserve.serving.batches.service import BatchService  # noqa: E402
from glmserve.state import BatchStore, ConversationStore, FileStore, ResponseStore, open_database  # noqa: E402
from tests.state_checks import crash_in, revisions, seed, upgrade, usage_agrees  # noqa: E402


class _Patch:
    """``monkeypatch``'s ``setattr``, outside pytest."""

    def setattr(self, target, name, value) -> None:
        setattr(target, name, value)


def main(folder: Path) -> None:
    for start in revisions()[:-1]:
        url = f"sqlite:///{folder / f'from-{start}.db'}"
        upgrade(url, start)
        engine = sa.create_engine(url)
        with engine.begin() as conn:
            seed(conn, start)
        engine.dispose()
        store = ResponseStore(open_database(url), 3600.0, 1 << 20)
        assert store.get("k", "resp_1") is not None
        usage_agrees(store.database)
    url = f"sqlite:///{folder / 'crash.db'}"
    upgrade(url, revisions()[-2])
    from alembic.runtime import migration
    real = migration.HeadMaintainer.update_to_step
    crash_in(_Patch(), revisions()[-1])
    try:
        open_database(url)
        raise AssertionError("the migration did not fail")
    except Exception as exc:  # noqa: BLE001
        assert "died here" in str(exc), exc
    migration.HeadMaintainer.update_to_step = real
    store = ResponseStore(open_database(url), 3600.0, 2_000_000, None, 2)
    for i in range(30):
        store.put("a", {"id": f"resp_a{i}", "status": "completed", "text": "x" * 5000}, [])
    service = BatchService(BatchStore(store.database, store.quota), FileStore(store))
    service.files.create("b", "file-b", "batch", "b.jsonl", b"{}\n" * 1000)
    ConversationStore(store).create("b", "conv_b", {}, [{"id": f"msg_{i}"} for i in range(20)])
    body = {"id": "batch_b", "object": "batch", "status": "in_progress", "errors": None,
            "endpoint": "/v1/chat/completions"}
    service.batches.create("b", "batch_b", "openai", body, [(f"r{i}", {"model": "m"}) for i in range(1200)])
    for line in service.batches.claim("runner", 1200, 30.0):
        service.batches.complete(line.id, "b", 200, {"n": line.custom_id})
    asyncio.run(service.finish_if_done("batch_b"))
    assert service.batches.body("batch_b")["status"] == "completed"
    usage_agrees(store.database)
    print("ok", old_sqlite.sqlite_version)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
