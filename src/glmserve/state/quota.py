"""The store's size bounds: ``--store-max-bytes`` over everything the state holds (stored
responses, conversation items, files, batch lines with their results) and, with
``--store-max-bytes-per-key``, over each owner's share of it.

What a client asks to keep (an upload, conversation items, a batch's lines) must fit under both
bounds: the owner's own oldest stored responses are deleted to make room, never another owner's
data, and what still does not fit is refused (``StoreFull``: a 400 ``store_full``). Stored
responses, kept like a cache for ``--store-ttl``, are trimmed after each write instead: the
owner's oldest past the per-key bound, then the oldest of any owner past the total. What the
server writes for a batch (line results, output files) is counted, never refused: a batch ends.
Blocking calls, inside the caller's transaction."""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from glmserve.state.tables import BATCH_LINES, BATCHES, CONVERSATIONS, FILES, ITEMS, RESPONSES, table_bytes


class StoreFull(Exception):
    """A write that would take the stored bytes past a bound."""


def stored_bytes(conn: Connection) -> int:
    """Bytes stored (responses, conversation items, files, batch lines), all owners together."""
    return sum(table_bytes(conn, table) for table in (RESPONSES, ITEMS, FILES, BATCH_LINES))


def owner_bytes(conn: Connection, owner: str) -> int:
    """Bytes stored for ``owner`` (the items of its conversations, the lines of its batches)."""
    def total(size: sa.Column, source: sa.FromClause, mine: sa.ColumnElement) -> int:
        query = sa.select(sa.func.coalesce(sa.func.sum(size), 0)).select_from(source).where(mine)
        return int(conn.execute(query).scalar_one())

    return (total(RESPONSES.c.size, RESPONSES, RESPONSES.c.owner == owner)
            + total(FILES.c.bytes, FILES, FILES.c.owner == owner)
            + total(ITEMS.c.size, ITEMS.join(CONVERSATIONS, CONVERSATIONS.c.id == ITEMS.c.conversation_id),
                    CONVERSATIONS.c.owner == owner)
            + total(BATCH_LINES.c.size, BATCH_LINES.join(BATCHES, BATCHES.c.id == BATCH_LINES.c.batch_id),
                    BATCHES.c.owner == owner))


@dataclass(frozen=True, slots=True)
class Quota:
    """``max_bytes`` in all; ``max_bytes_per_key`` per owner (None: no per-owner bound)."""

    max_bytes: int
    max_bytes_per_key: int | None = None

    def _excess(self, conn: Connection, owner: str, incoming: int) -> int:
        excess = stored_bytes(conn) + incoming - self.max_bytes
        if self.max_bytes_per_key is not None:
            excess = max(excess, owner_bytes(conn, owner) + incoming - self.max_bytes_per_key)
        return excess

    def reserve(self, conn: Connection, owner: str, incoming: int) -> None:
        """Make room for ``incoming`` bytes of ``owner``: its own oldest stored responses are
        deleted while a bound would be passed. Raises ``StoreFull`` (deleting nothing) when
        that is not enough."""
        excess = self._excess(conn, owner, incoming)
        if excess <= 0:
            return
        doomed = _oldest(conn, excess, RESPONSES.c.owner == owner)
        if doomed is None:
            bound = ("--store-max-bytes-per-key", self.max_bytes_per_key) \
                if self.max_bytes_per_key is not None and owner_bytes(conn, owner) + incoming > self.max_bytes_per_key \
                else ("--store-max-bytes", self.max_bytes)
            raise StoreFull(f"the server's store is full ({bound[0]} {bound[1]}): delete files, batches or "
                            "conversations to make room")
        conn.execute(sa.delete(RESPONSES).where(RESPONSES.c.id.in_(doomed)))

    def trim(self, conn: Connection, owner: str, keep: str) -> None:
        """After ``owner`` stored the response ``keep``: delete the owner's oldest other
        responses past the per-key bound, then any owner's oldest responses past the total
        (as far as responses go)."""
        others = RESPONSES.c.id != keep
        if self.max_bytes_per_key is not None:
            excess = owner_bytes(conn, owner) - self.max_bytes_per_key
            if excess > 0:
                conn.execute(sa.delete(RESPONSES).where(RESPONSES.c.id.in_(
                    _oldest(conn, excess, sa.and_(RESPONSES.c.owner == owner, others), partial=True) or [])))
        excess = stored_bytes(conn) - self.max_bytes
        if excess > 0:
            conn.execute(sa.delete(RESPONSES).where(RESPONSES.c.id.in_(
                _oldest(conn, excess, others, partial=True) or [])))


def _oldest(conn: Connection, excess: int, where: sa.ColumnElement, partial: bool = False) -> list[str] | None:
    """Ids of the oldest responses matching ``where`` whose sizes sum to at least ``excess``;
    when they do not reach it: None, or (``partial``) all of them."""
    doomed: list[str] = []
    for row in conn.execute(sa.select(RESPONSES.c.id, RESPONSES.c.size).where(where)
                            .order_by(RESPONSES.c.created_at, RESPONSES.c.id)):
        if excess <= 0:
            break
        doomed.append(row.id)
        excess -= row.size
    return doomed if excess <= 0 or partial else None
