"""The state database's tables, as the stores read and write them (the migrations in
``state/migrations`` make them; ``tests/unit/state/test_state.py`` checks that the two agree)."""

from __future__ import annotations

import json
import time
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

METADATA = sa.MetaData()
RESPONSES = sa.Table(
    "responses", METADATA,
    sa.Column("id", sa.String(80), primary_key=True),
    sa.Column("owner", sa.String(64), nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("expires_at", sa.Float, nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("body", sa.Text, nullable=False),
    sa.Column("input_items", sa.Text, nullable=False),
    sa.Column("size", sa.BigInteger, nullable=False),
    sa.Column("heartbeat_at", sa.Float, nullable=True),  # a queued or in-progress run's server is alive
)
CONVERSATIONS = sa.Table(
    "conversations", METADATA,
    sa.Column("id", sa.String(80), primary_key=True),
    sa.Column("owner", sa.String(64), nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("metadata", sa.Text, nullable=False),
)
ITEMS = sa.Table(
    "conversation_items", METADATA,
    sa.Column("seq", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True),
    sa.Column("conversation_id", sa.String(80), nullable=False),
    sa.Column("item_id", sa.Text, nullable=False),  # the client's id for it
    sa.Column("body", sa.Text, nullable=False),
    sa.Column("size", sa.BigInteger, nullable=False),
)

FILES = sa.Table(
    "files", METADATA,
    sa.Column("id", sa.String(80), primary_key=True),
    sa.Column("owner", sa.String(64), nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("purpose", sa.String(32), nullable=False),
    sa.Column("filename", sa.Text, nullable=False),
    sa.Column("bytes", sa.BigInteger, nullable=False),
)
FILE_CHUNKS = sa.Table(  # a file's bytes, in pieces of at most files.CHUNK_BYTES, in order of seq
    "file_chunks", METADATA,
    sa.Column("file_id", sa.String(80), primary_key=True),
    sa.Column("seq", sa.Integer, primary_key=True),
    sa.Column("data", sa.LargeBinary, nullable=False),
)
BATCHES = sa.Table(
    "batches", METADATA,
    sa.Column("id", sa.String(80), primary_key=True),
    sa.Column("owner", sa.String(64), nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("api", sa.String(16), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("body", sa.Text, nullable=False),
    sa.Column("expires_at", sa.Float, nullable=True),  # the end of its completion window
    sa.Column("build", sa.Text, nullable=True),  # an ending batch's files being written (batches.Build, JSON)
    sa.Column("build_at", sa.Float, nullable=True),  # when its builder last wrote a piece (db_now)
)
BATCH_LINES = sa.Table(
    "batch_lines", METADATA,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True),
    sa.Column("batch_id", sa.String(80), nullable=False),
    sa.Column("line_no", sa.Integer, nullable=False),
    sa.Column("custom_id", sa.Text, nullable=False),
    sa.Column("request", sa.Text, nullable=False),
    sa.Column("done", sa.Boolean, nullable=False),
    sa.Column("claimed_by", sa.String(64), nullable=True),
    sa.Column("claimed_at", sa.Float, nullable=True),
    sa.Column("status_code", sa.Integer, nullable=True),
    sa.Column("result", sa.Text, nullable=True),
    sa.Column("model", sa.Text, nullable=True),  # the request's model: only servers serving it claim the line
    sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),  # times claimed
    sa.Column("retries", sa.Integer, nullable=False, server_default="0"),  # claims that ended in a 429/503
    sa.Column("not_before", sa.Float, nullable=True),  # a retried line's back-off
    sa.Column("size", sa.BigInteger, nullable=False, server_default="0"),  # bytes of its request and result
)


USAGE = sa.Table(  # bytes stored per owner, kept in the transaction of each write (state/quota.py)
    "store_usage", METADATA,
    sa.Column("owner", sa.String(64), primary_key=True),  # quota.TOTAL: all owners together
    sa.Column("bytes", sa.BigInteger, nullable=False),
)


def dumps(value: Any) -> str:
    """``value`` as compact JSON text, ASCII only: a lone surrogate or a NUL a client sent is
    escaped, so every database takes it."""
    return json.dumps(value, separators=(",", ":"))


def db_now(conn: Connection) -> float:
    """The database's clock, in epoch seconds: what claim leases and heartbeats are written and
    compared in, so that replicas on hosts whose clocks differ agree (PostgreSQL's
    ``clock_timestamp()``; an SQLite file is on this host, whose clock is the same for all)."""
    if conn.dialect.name == "postgresql":
        return float(conn.execute(sa.text("SELECT extract(epoch FROM clock_timestamp())")).scalar_one())
    return time.time()


class UnknownCursor(Exception):
    """A list's ``after`` that is not one of the listed objects."""


def keyset_page(conn: Connection, query: sa.Select, columns: tuple[sa.ColumnElement, ...],
                after: sa.Select | None, limit: int, descending: bool) -> list:
    """Up to ``limit + 1`` rows of ``query`` (one more than a page: whether there are more)
    ordered by ``columns`` (a unique key), after the row whose key ``after`` selects (keyset
    paging: no row before it is read). Raises ``UnknownCursor`` when ``after`` selects none."""
    if after is not None:
        key = conn.execute(after).first()
        if key is None:
            raise UnknownCursor()
        row, mark = sa.tuple_(*columns), sa.tuple_(*(sa.literal(v) for v in key))
        query = query.where(row < mark if descending else row > mark)
    return list(conn.execute(query.order_by(*(c.desc() if descending else c.asc() for c in columns))
                             .limit(limit + 1)))
