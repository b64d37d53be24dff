"""The state database (``glmserve.state``): migrations, SQLite's WAL mode, retention by age and
by size, owners, and the settings that choose it. PostgreSQL: ``tests/e2e/test_stored_responses.py``."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time

import pytest
import sqlalchemy as sa
from pydantic import ValidationError

from glmserve.server.endpoints import ENDPOINTS
from glmserve.state import DatabaseError, ResponseStore, open_database, sqlalchemy_url
from glmserve.state import responses as responses_module
from glmserve.state.tables import METADATA


def _newest_revision() -> str:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    from glmserve.state.database import MIGRATIONS

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return ScriptDirectory.from_config(config).get_current_head()


def _store(tmp_path, ttl_s: float = 100.0, max_bytes: int = 1 << 20) -> ResponseStore:
    return ResponseStore(open_database(f"sqlite:///{tmp_path / 'sub' / 'state.db'}"), ttl_s, max_bytes)


def test_the_schema_is_migrated_once_and_sqlite_runs_in_wal_mode(tmp_path):
    store = _store(tmp_path)
    store.put("", {"id": "resp_1", "status": "completed"}, [])
    open_database(f"sqlite:///{tmp_path / 'sub' / 'state.db'}")  # again: already at the newest revision
    with sqlite3.connect(tmp_path / "sub" / "state.db") as conn:
        assert conn.execute("SELECT version_num FROM alembic_version").fetchall() == [(_newest_revision(),)]
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert store.get("", "resp_1").body["status"] == "completed"


def test_put_replaces_by_id_and_owners_are_apart(tmp_path):
    store = _store(tmp_path)
    store.put("a", {"id": "resp_1", "status": "queued"}, [{"type": "message"}])
    store.put("a", {"id": "resp_1", "status": "completed", "output": [1]}, [{"type": "message"}])
    assert store.get("a", "resp_1").body == {"id": "resp_1", "status": "completed", "output": [1]}
    assert store.get("b", "resp_1") is None
    assert not store.delete("b", "resp_1") and store.get("a", "resp_1") is not None
    assert store.delete("a", "resp_1") and store.get("a", "resp_1") is None


def test_a_response_expires_after_its_ttl(tmp_path, monkeypatch):
    store = _store(tmp_path, ttl_s=100)
    store.put("", {"id": "resp_old", "status": "completed"}, [])
    now = time.time()
    assert store.purge(now) == 0
    monkeypatch.setattr(responses_module.time, "time", lambda: now + 101)
    assert store.get("", "resp_old") is None  # unreadable at once, before any purge
    assert not store.delete("", "resp_old")
    assert store.purge(now + 101) == 1 and store.total_bytes() == 0


def test_the_oldest_go_first_past_the_size_bound(tmp_path):
    store = _store(tmp_path, max_bytes=2000)
    for i in range(10):
        store.put("", {"id": f"resp_{i}", "status": "completed", "text": "x" * 300}, [])
    kept = [i for i in range(10) if store.get("", f"resp_{i}") is not None]
    assert kept == list(range(10 - len(kept), 10)) and 3 <= len(kept) <= 6
    assert store.total_bytes() <= 2000


def test_urls():
    assert sqlalchemy_url("postgresql://u@h:5/db") == "postgresql+psycopg://u@h:5/db"
    assert sqlalchemy_url("postgres://u@h/db") == "postgresql+psycopg://u@h/db"
    assert sqlalchemy_url("sqlite:////tmp/x.db") == "sqlite:////tmp/x.db"
    for bad in ("mysql://h/db", "state.db", ""):
        with pytest.raises(ValueError):
            sqlalchemy_url(bad)


def test_an_unreachable_database_is_one_line(tmp_path):
    with pytest.raises(DatabaseError) as err:
        open_database("postgresql://nobody:secret@127.0.0.1:1/db")
    message = str(err.value)
    assert "\n" not in message and "secret" not in message and "127.0.0.1" in message
    (tmp_path / "file").write_text("")
    with pytest.raises(DatabaseError):  # its folder is a file
        open_database(f"sqlite:///{tmp_path / 'file' / 'state.db'}")


def test_settings(tmp_path):
    from glmserve.settings.serve import ServeSettings

    settings = ServeSettings(state_dir=str(tmp_path))
    assert settings.state_database_url() == f"sqlite:///{tmp_path / 'state.db'}"
    assert settings.store_ttl_s() == 30 * 86400
    assert ServeSettings(store_ttl="12h").store_ttl_s() == 12 * 3600
    assert ServeSettings(database_url="postgresql://h/db").state_database_url() == "postgresql://h/db"
    assert settings.batch_lease_s() == 30 and ServeSettings(batch_lease="2m").batch_lease_s() == 120
    for bad in ({"database_url": "mysql://h/db"}, {"store_ttl": "0"}, {"store_ttl": "-1"}, {"store_ttl": "soon"},
                {"store_max_bytes": 0}, {"api_key": ["a", " "]}, {"batch_lease": "2s"}, {"batch_lease": "-30"},
                {"batch_lease": "soon"}, {"batch_lease": "inf"}, {"batch_lease": "2d"}):
        with pytest.raises(ValidationError):
            ServeSettings(**bad)
    assert ServeSettings(api_key="a,b").api_key == ["a", "b"]
    assert ServeSettings(api_key='["a,1", "b"]').api_key == ["a,1", "b"]


def test_the_server_does_not_start_on_a_database_it_cannot_open(tmp_path):
    from glmserve.composition import build_app
    from glmserve.runtime.start import STARTUP_ERRORS
    from glmserve.settings.serve import ServeSettings

    with pytest.raises(STARTUP_ERRORS) as err:
        build_app(ServeSettings(database_url="postgresql://127.0.0.1:1/db"))
    assert isinstance(err.value, DatabaseError)


def test_the_migrations_make_the_tables_the_stores_read(tmp_path):
    engine = open_database(f"sqlite:///{tmp_path / 'state.db'}")
    for table in METADATA.sorted_tables:
        assert {c["name"] for c in sa.inspect(engine).get_columns(table.name)} == {c.name for c in table.columns}


def test_a_batch_file_splits_only_at_line_feeds(tmp_path):
    """JSONL lines end at LF or CRLF; a raw U+2028 or U+0085 inside a JSON string (valid JSON)
    stays in its line."""
    from glmserve.serving.batches.service import BatchService
    from glmserve.state import BatchStore, FileStore

    database = open_database(f"sqlite:///{tmp_path / 'state.db'}")
    service = BatchService(BatchStore(database), FileStore(ResponseStore(database, 100.0, 1 << 20)))
    lines = [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": "m", "messages": [{"role": "user", "content": f"a{sep}b"}]}}
             for i, sep in enumerate(["\u2028", "\x85", "\u2029"])]
    content = "\r\n".join(json.dumps(line, ensure_ascii=False) for line in lines).encode() + b"\n\n"

    async def make() -> dict:
        file = await service.file_service.upload("", "batch", "in.jsonl", content)
        return await service.create("", file["id"], "/v1/chat/completions", "24h", None, ENDPOINTS)

    batch = asyncio.run(make())
    assert batch["status"] == "in_progress", batch["errors"]
    assert batch["request_counts"]["total"] == 3


def test_a_background_run_whose_server_stopped_reads_as_failed(tmp_path, monkeypatch):
    """A queued or in-progress response carries a heartbeat that its server renews; once the
    heartbeat is LOST_AFTER_S old (the server died), reading it stores and returns it failed.
    A run with a fresh heartbeat (running on another replica) and a finished one are left as
    they are, and a run renewed between the read and the write is not failed."""
    from glmserve.serving.responses.stored import LOST_AFTER_S, ResponseStorage

    store = _store(tmp_path)
    storage = ResponseStorage(store)
    for rid, status in [("resp_lost", "in_progress"), ("resp_live", "queued"), ("resp_done", "completed")]:
        store.put("k", {"id": rid, "status": status, "background": True}, [{"type": "message"}])
    assert store.get("k", "resp_done").heartbeat_at is None
    assert store.get("k", "resp_live").heartbeat_at == pytest.approx(time.time(), abs=5)
    later = time.time() + LOST_AFTER_S + 1
    monkeypatch.setattr(time, "time", lambda: later)  # the clock of both layers
    seen = store.get("k", "resp_live")
    store.heartbeat(["resp_live", "resp_done"])  # renewed (by another replica) after the read
    assert not store.fail_lost("k", seen, {**seen.body, "status": "failed"})

    async def read(rid: str) -> dict:
        return await storage.get(rid, "k")

    lost = asyncio.run(read("resp_lost"))
    assert lost["status"] == "failed" and lost["error"]["code"] == "server_error"
    assert store.get("k", "resp_lost").body == lost and store.get("k", "resp_lost").input_items == [{"type": "message"}]
    assert asyncio.run(read("resp_live"))["status"] == "queued"
    assert asyncio.run(read("resp_done"))["status"] == "completed"
    assert store.get("k", "resp_done").heartbeat_at is None


def test_the_database_is_private_to_its_user(tmp_path):
    """The state holds every key's prompts, outputs and uploads: the folder is made 0700, the
    file and its WAL and SHM files 0600."""
    path = tmp_path / "new" / "state.db"
    store = ResponseStore(open_database(f"sqlite:///{path}"), 100.0, 1 << 20)
    store.put("k", {"id": "resp_1", "status": "completed"}, [])
    with store.database.connect() as conn:  # an open connection keeps the WAL and SHM files
        conn.execute(sa.text("SELECT 1"))
        modes = {p.name: p.stat().st_mode & 0o777 for p in path.parent.iterdir() if p.name.startswith("state.db")}
    assert path.parent.stat().st_mode & 0o777 == 0o700
    assert {"state.db", "state.db-wal", "state.db-shm"} <= set(modes), modes
    assert set(modes.values()) == {0o600}, modes


def _open_when_released(url: str, barrier) -> None:
    barrier.wait()
    open_database(url)


def test_processes_starting_together_on_a_fresh_database_all_come_up(tmp_path):
    """Replicas on one machine share the SQLite file: several processes opening it fresh at
    the same moment migrate it once and all start."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    for attempt in range(3):
        url = f"sqlite:///{tmp_path / str(attempt) / 'state.db'}"
        barrier = context.Barrier(4)
        procs = [context.Process(target=_open_when_released, args=(url, barrier)) for _ in range(4)]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join(120)
        assert [proc.exitcode for proc in procs] == [0, 0, 0, 0]
    with sqlite3.connect(tmp_path / "0" / "state.db") as conn:
        assert conn.execute("SELECT version_num FROM alembic_version").fetchall() == [(_newest_revision(),)]


def test_a_cancel_from_another_server_does_not_overwrite_a_run_that_ended(tmp_path, monkeypatch):
    """The cancel of a background run that runs elsewhere is a conditional write: if that run
    ended between the cancel's read and its write, the ended response stays (and is returned)."""
    from glmserve.serving.responses.stored import ResponseStorage

    store = _store(tmp_path)
    storage = ResponseStorage(store)
    running = {"id": "resp_elsewhere", "status": "in_progress", "background": True}
    store.put("k", running, [{"type": "message"}])
    reads = iter([running])  # the cancel's first read sees it running; then the other server ends it
    store.put("k", {**running, "status": "completed", "output": [1]}, [{"type": "message"}])
    real_get = ResponseStorage.get

    async def stale_first(self, response_id: str, owner: str) -> dict:
        return next(reads, None) or await real_get(self, response_id, owner)

    monkeypatch.setattr(ResponseStorage, "get", stale_first)
    answer = asyncio.run(storage.cancel("resp_elsewhere", "k"))
    assert answer["status"] == "completed" and store.get("k", "resp_elsewhere").body["status"] == "completed"
    store.put("k", {**running, "id": "resp_lost"}, [])  # a run still going elsewhere is cancelled
    assert asyncio.run(storage.cancel("resp_lost", "k"))["status"] == "cancelled"
    assert store.get("k", "resp_lost").body["status"] == "cancelled" and store.get("k", "resp_lost").heartbeat_at is None


def test_lists_are_paged_and_items_found_in_the_database(tmp_path, monkeypatch):
    """Conversation items, files and batches are paged in SQL (keyset on their order), and an
    item is looked up by id: no route reads a whole conversation or an owner's whole table."""
    from glmserve.protocol.errors import APIError
    from glmserve.serving.batches.service import BatchService
    from glmserve.serving.responses.conversations import ConversationService
    from glmserve.state import BatchStore, ConversationStore, FileStore

    store = _store(tmp_path)
    conversations = ConversationService(ConversationStore(store))
    files = BatchService(BatchStore(store.database), FileStore(store))
    conversations.store.create("k", "conv_1", {}, [{"id": f"msg_{i}", "type": "message"} for i in range(25)])
    monkeypatch.setattr(ConversationStore, "items", lambda *a: pytest.fail("a whole conversation was read"))

    async def walk(order: str) -> list[str]:
        seen, after = [], None
        while True:
            got = await conversations.list_items("conv_1", "k", after, 10, order)
            seen += [item["id"] for item in got["data"]]
            if not got["has_more"]:
                return seen
            after = got["last_id"]

    assert asyncio.run(walk("asc")) == [f"msg_{i}" for i in range(25)]
    assert asyncio.run(walk("desc")) == [f"msg_{i}" for i in reversed(range(25))]
    assert asyncio.run(conversations.get_item("conv_1", "k", "msg_7"))["id"] == "msg_7"
    for call, status in [(conversations.get_item("conv_1", "k", "msg_99"), 404),
                         (conversations.get_item("conv_1", "other", "msg_7"), 404),
                         (conversations.list_items("conv_1", "k", "msg_99", 10, "asc"), 400),
                         (files.file_service.list_files("k", None, "file-nope", 10, "desc"), 400)]:
        with pytest.raises(APIError) as err:
            asyncio.run(call)
        assert err.value.status_code == status

    async def upload(i: int) -> str:
        return (await files.file_service.upload("k", "batch", f"{i}.jsonl", b"{}\n"))["id"]

    ids = [asyncio.run(upload(i)) for i in range(7)]
    first = asyncio.run(files.file_service.list_files("k", None, None, 3, "desc"))
    assert [f["id"] for f in first["data"]] == ids[::-1][:3] and first["has_more"]
    rest = asyncio.run(files.file_service.list_files("k", "batch", first["last_id"], 10, "desc"))
    assert [f["id"] for f in rest["data"]] == ids[::-1][3:] and not rest["has_more"]
    assert asyncio.run(files.file_service.list_files("other", None, None, 10, "asc"))["data"] == []


def test_the_bounds_count_everything_and_one_key_never_evicts_another(tmp_path):
    """``--store-max-bytes`` counts responses, conversation items, files and batch lines; with
    ``--store-max-bytes-per-key`` each key's share too. An upload, items or a batch that do not
    fit take the room of the same key's oldest responses, never another key's, and are refused
    past that; an OpenAI batch that ended keeps its results in its files, not twice."""
    from glmserve.state import BatchStore, ConversationStore, FileStore, StoreFull
    from glmserve.state.quota import owner_bytes

    store = ResponseStore(open_database(f"sqlite:///{tmp_path / 'state.db'}"), 100.0, 60_000, 30_000)
    files, batches = FileStore(store), BatchStore(store.database, store.quota)
    conversations = ConversationStore(store)
    for i in range(4):  # key b: 4 responses of ~2 kB
        store.put("b", {"id": f"resp_b{i}", "status": "completed", "text": "x" * 2000}, [])
    for i in range(3):
        store.put("a", {"id": f"resp_a{i}", "status": "completed", "text": "y" * 2000}, [])
    files.create("a", "file-a1", "batch", "a.jsonl", b"z" * 25_000)  # fits a's 30 kB: its oldest response goes
    assert [store.get("a", f"resp_a{i}") is not None for i in range(3)] == [False, True, True]
    with pytest.raises(StoreFull, match="per-key"):  # a's responses cannot make room for 10 kB more
        files.create("a", "file-a2", "batch", "a.jsonl", b"z" * 10_000)
    with pytest.raises(StoreFull):
        batches.create("a", "batch_a", "openai", {"status": "in_progress"}, [("l", {"text": "w" * 10_000})])
    with pytest.raises(StoreFull):
        conversations.create("a", "conv_a", {}, [{"id": "msg_1", "text": "v" * 10_000}])
    assert all(store.get("b", f"resp_b{i}") is not None for i in range(4))  # b lost nothing to a
    assert files.get("a", "file-a2") is None and batches.get("a", "batch_a", "openai") is None
    # batch lines count, with their results
    before = owner_bytes(store.database.connect(), "b")
    batches.create("b", "batch_b", "openai", {"status": "in_progress"}, [("l1", {"text": "u" * 1000})])
    [line] = batches.claim("r", 1, 30.0)
    batches.complete(line.id, "b", 200, {"answer": "t" * 3000})
    with store.database.connect() as conn:
        assert owner_bytes(conn, "b") - before > 4000
    # c's responses past its share push out its own oldest, never another key's, never a file
    for i in range(40):
        store.put("c", {"id": f"resp_c{i}", "status": "completed", "text": "s" * 2000}, [])
    assert store.total_bytes() <= 60_000 and files.get("a", "file-a1") is not None
    assert all(store.get("b", f"resp_b{i}") is not None for i in range(4))


def test_files_are_stored_and_read_in_pieces_and_a_refused_upload_leaves_none(tmp_path):
    """A file is written and read a piece (``files.CHUNK_BYTES``) at a time: an upload of
    several pieces comes back byte for byte, a request line across two pieces is parsed whole,
    and an upload refused in its last piece (not UTF-8) leaves no piece behind."""
    from glmserve.serving.batches.service import BatchService
    from glmserve.state import BatchStore, FileStore
    from glmserve.state.files import CHUNK_BYTES
    from glmserve.state.tables import FILE_CHUNKS

    store = ResponseStore(open_database(f"sqlite:///{tmp_path / 'state.db'}"), 100.0, 1 << 30)
    service = BatchService(BatchStore(store.database, store.quota), FileStore(store))
    rows, size = [], 0
    while size < 2.5 * CHUNK_BYTES:  # lines of ~3 kB of two-byte characters: some split between pieces
        row = json.dumps({"custom_id": f"r{len(rows)}", "method": "POST", "url": "/v1/chat/completions",
                          "body": {"model": "m", "messages": [{"role": "user", "content": "\u00e9" * 1500}]}},
                         ensure_ascii=False).encode() + b"\n"
        rows.append(row)
        size += len(row)
    content = b"".join(rows)

    async def scenario() -> tuple[dict, bytes, dict]:
        file = await service.file_service.upload("k", "batch", "big.jsonl", content)
        _, pieces = await service.file_service.file_content("k", file["id"])
        back = b"".join([piece async for piece in pieces])
        batch = await service.create("k", file["id"], "/v1/chat/completions", "24h", None, ENDPOINTS)
        return file, back, batch

    file, back, batch = asyncio.run(scenario())
    assert file["bytes"] == len(content) and back == content
    assert batch["status"] == "in_progress" and batch["request_counts"]["total"] == len(rows)

    def pieces_stored() -> int:
        with store.database.connect() as conn:
            return conn.execute(sa.select(sa.func.count()).select_from(FILE_CHUNKS)).scalar_one()

    assert pieces_stored() == 3
    with pytest.raises(Exception) as refused:
        asyncio.run(service.file_service.upload("k", "batch", "bad.jsonl", content + b"\xff"))
    assert refused.value.status_code == 400 and pieces_stored() == 3
    assert [f["id"] for f in asyncio.run(service.file_service.list_files("k", None, None, 10, "asc"))["data"]] == [file["id"]]


def test_a_file_stored_before_pieces_is_kept_by_the_migration(tmp_path):
    """Revision 0006 moves each file's bytes (``files.content``) into ``file_chunks``."""
    from alembic import command
    from alembic.config import Config

    from glmserve.state import FileStore
    from glmserve.state.database import MIGRATIONS

    url = f"sqlite:///{tmp_path / 'state.db'}"
    engine = sa.create_engine(url)
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, "0005")
        conn.execute(sa.text("INSERT INTO files (id, owner, created_at, purpose, filename, bytes, content) "
                             "VALUES ('file-old', 'k', 1.0, 'batch', 'old.jsonl', 5, :c)"), {"c": b"{}\n{}"})
    engine.dispose()
    files = FileStore(ResponseStore(open_database(url), 100.0, 1 << 20))
    assert files.get("k", "file-old")["bytes"] == 5 and b"".join(files.pieces("file-old")) == b"{}\n{}"
