"""Checks on a state database shared by the SQLite (``tests/unit/state``) and PostgreSQL
(``tests/e2e/test_state_postgres.py``) tests: whether ``store_usage`` agrees with the tables,
and Alembic's revisions to migrate a database to one of them."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from glmserve.state.quota import TOTAL, stored_bytes
from glmserve.state.tables import USAGE

_OWNED = ("SELECT owner, size FROM responses", "SELECT owner, bytes FROM files",
          "SELECT c.owner, i.size FROM conversation_items i JOIN conversations c ON c.id = i.conversation_id",
          "SELECT b.owner, l.size FROM batch_lines l JOIN batches b ON b.id = l.batch_id")


def usage_agrees(database: Engine) -> None:
    """Assert that each owner's bytes in ``store_usage``, and the total, are what the tables hold."""
    with database.connect() as conn:
        sums: dict[str, int] = {}
        for query in _OWNED:
            for owner, size in conn.execute(sa.text(query)):
                sums[owner] = sums.get(owner, 0) + int(size)
        usage = {row.owner: int(row.bytes) for row in conn.execute(sa.select(USAGE)) if row.owner != TOTAL}
        assert {k: v for k, v in usage.items() if v} == {k: v for k, v in sums.items() if v}
        assert stored_bytes(conn) == sum(sums.values())


def revisions() -> list[str]:
    """The migrations' revisions, oldest first."""
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    from glmserve.state.database import MIGRATIONS

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return [s.revision for s in reversed(list(ScriptDirectory.from_config(config).walk_revisions()))]


def upgrade(url: str, revision: str) -> None:
    """Migrate the database at ``url`` (a SQLAlchemy URL) to ``revision``, as an earlier
    version of the server left it."""
    from alembic import command
    from alembic.config import Config

    from glmserve.state.database import MIGRATIONS

    engine = sa.create_engine(url)
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, revision)
    engine.dispose()


def crash_in(monkeypatch, revision: str) -> None:
    """Make the migration to ``revision`` fail after its statements ran, before its revision
    is written (as a process killed there)."""
    from alembic.runtime import migration

    real = migration.HeadMaintainer.update_to_step

    def crash(self, step):
        if step.info.up_revision_id == revision:
            raise RuntimeError("the process died here")
        return real(self, step)

    monkeypatch.setattr(migration.HeadMaintainer, "update_to_step", crash)


def seed(conn, revision: str) -> None:
    """Store, as a server at ``revision`` would have, the response ``resp_1`` and (from 0003)
    the file ``file-1`` (3 bytes, ``{}`` and a line feed; before 0006 in ``files.content``),
    both of the owner ``k``."""
    conn.execute(sa.text("INSERT INTO responses (id, owner, created_at, expires_at, status, body, input_items, "
                         "size) VALUES ('resp_1', 'k', 1.0, 9e9, 'completed', '{}', '[]', 4)"))
    if revision >= "0003":
        content = ", content" if revision < "0006" else ""
        conn.execute(sa.text(f"INSERT INTO files (id, owner, created_at, purpose, filename, bytes{content}) "
                             f"VALUES ('file-1', 'k', 1.0, 'batch', 'a.jsonl', 3{', :c' if content else ''})"),
                     {"c": b"{}\n"})
