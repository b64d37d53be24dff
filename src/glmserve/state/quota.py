"""The store's size bounds: ``--store-max-bytes`` over everything the state holds (stored
responses, conversation items, files, batch lines with their results) and a share of it per
owner (an API key): ``--store-max-bytes-per-key``, by default ``--store-max-bytes`` divided by
the number of the server's keys, so that no key can fill the store for the others.

Each owner's stored bytes, and all owners' together (the row ``TOTAL``), are kept in the table
``store_usage``, changed in the same transaction as each write (``charge``): no write sums
whole tables. ``charge`` updates the ``TOTAL`` row first: that takes SQLite's write lock (a
write transaction's first statement) and a row lock on PostgreSQL, so the sizes a write
checks cannot change under it before it commits (two uploads checked at once cannot both
pass a bound).

Making room (``Quota.reserve``, ``Quota.trim``) deletes stored responses only (kept like a
cache, for ``--store-ttl``), never files, conversations or batches, and of those, only:

1. the writer's own oldest, while the writer is past its share;
2. then, while the total is past ``--store-max-bytes``: the oldest of the owners past their
   share, each only down to its share; then the writer's own oldest.

An owner within its share never loses data to another owner. A write of what a client asks
to keep (an upload, conversation items, a batch's lines, a line's result) that still does not
fit raises ``StoreFull`` (a 400 ``store_full`` naming the owner's use and the bound), and its
transaction rolls back, deletions included; a stored response is written, and the bounds kept
as far as deleting responses goes. Responses are deleted ``PAGE`` ids at a time (SQLite
allows 32,766 parameters in one statement). A background run still going is never deleted, so its
first state is written with ``reserve`` (refused when it does not fit), its later ones with ``trim``.
Blocking calls, inside the caller's transaction."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from glmserve.state.tables import RESPONSES, USAGE

TOTAL = "*"  # store_usage's row of all owners together (an owner is a 64-digit hex digest, or "")
PAGE = 500  # responses read, and deleted, per statement while making room
RUNNING = ("queued", "in_progress")  # a background run's statuses while it goes (never evicted)


class StoreFull(Exception):
    """A write that would take the stored bytes past a bound."""


def charge(conn: Connection, owner: str, delta: int) -> tuple[int, int]:
    """Add ``delta`` bytes (negative: freed) to ``owner``'s stored bytes and to the total;
    ``(owner's bytes, total bytes)`` after. Its first statement updates the ``TOTAL`` row:
    the store's write lock until the caller's transaction ends (call it first)."""
    if conn.execute(sa.update(USAGE).where(USAGE.c.owner == TOTAL)
                    .values(bytes=USAGE.c.bytes + delta)).rowcount == 0:
        conn.execute(sa.insert(USAGE).values(owner=TOTAL, bytes=delta))
    if owner != TOTAL and conn.execute(sa.update(USAGE).where(USAGE.c.owner == owner)
                                       .values(bytes=USAGE.c.bytes + delta)).rowcount == 0:
        conn.execute(sa.insert(USAGE).values(owner=owner, bytes=delta))
    rows = dict(conn.execute(sa.select(USAGE.c.owner, USAGE.c.bytes).where(USAGE.c.owner.in_([owner, TOTAL]))).all())
    return int(rows[owner]), int(rows[TOTAL])


def charge_each(conn: Connection, freed: dict[str, int]) -> None:
    """Take each owner's freed bytes (``{owner: bytes}``) off its and the total's use."""
    for owner, size in freed.items():
        if size:
            charge(conn, owner, -size)


def owner_bytes(conn: Connection, owner: str) -> int:
    """Bytes stored for ``owner`` (its responses, files, batch lines, its conversations' items)."""
    return int(conn.execute(sa.select(USAGE.c.bytes).where(USAGE.c.owner == owner)).scalar() or 0)


def stored_bytes(conn: Connection) -> int:
    """Bytes stored, all owners together."""
    return owner_bytes(conn, TOTAL)


def delete_responses(conn: Connection, where: sa.ColumnElement, limit: int | None = None) -> int:
    """Delete the responses matching ``where`` (``limit``: at most that many), ``PAGE`` at a
    time, and take their bytes off their owners' use; how many were deleted."""
    freed: dict[str, int] = {}
    count = 0
    while limit is None or count < limit:
        page = PAGE if limit is None else min(PAGE, limit - count)
        rows = conn.execute(sa.select(RESPONSES.c.id, RESPONSES.c.owner, RESPONSES.c.size).where(where)
                            .limit(page)).all()
        _delete(conn, rows, freed)
        count += len(rows)
        if len(rows) < page:
            break
    charge_each(conn, freed)
    return count


def _delete(conn: Connection, rows: Iterable, freed: dict[str, int]) -> None:
    rows = list(rows)
    for start in range(0, len(rows), PAGE):
        page = rows[start:start + PAGE]
        conn.execute(sa.delete(RESPONSES).where(RESPONSES.c.id.in_([row.id for row in page])))
        for row in page:
            freed[row.owner] = freed.get(row.owner, 0) + int(row.size)


@dataclass(frozen=True, slots=True)
class Quota:
    """``max_bytes`` in all (None: no bound); ``max_bytes_per_key`` each owner's share (None:
    ``max_bytes`` divided by ``keys``, the number of the server's API keys)."""

    max_bytes: int | None = None
    max_bytes_per_key: int | None = None
    keys: int = 1

    @property
    def share(self) -> int | None:
        """The bytes one owner may keep (None: no bound)."""
        if self.max_bytes_per_key is not None:
            return self.max_bytes_per_key
        return None if self.max_bytes is None else self.max_bytes // max(1, self.keys)

    def reserve(self, conn: Connection, owner: str, incoming: int) -> None:
        """Count ``incoming`` more bytes of ``owner`` and make room for them (see the module's
        rules). Raises ``StoreFull`` when they do not fit; the caller's transaction then rolls
        back, so nothing is counted or deleted."""
        mine, total = charge(conn, owner, incoming)
        self._make_room(conn, owner, mine, total, RESPONSES.c.id.is_not(None), incoming)

    def trim(self, conn: Connection, owner: str, delta: int, keep: str) -> None:
        """Count ``delta`` more bytes of ``owner``'s stored response ``keep`` and keep the
        bounds by deleting other responses, as far as they go (never refused)."""
        mine, total = charge(conn, owner, delta)
        self._make_room(conn, owner, mine, total, RESPONSES.c.id != keep, None)

    def _make_room(self, conn: Connection, owner: str, mine: int, total: int, others: sa.ColumnElement,
                   incoming: int | None) -> None:
        share = self.share
        if share is None or self.max_bytes is None:
            return
        if mine > share:
            freed = self._evict(conn, {owner: mine - share}, others, mine - share)
            mine, total = mine - freed, total - freed
            if mine > share and incoming is not None:
                flag = "--store-max-bytes-per-key" if self.max_bytes_per_key is not None else \
                    f"--store-max-bytes / {self.keys} keys; see --store-max-bytes-per-key"
                raise StoreFull(f"the server's store is full for this API key: {incoming} bytes more would bring "
                                f"its stored bytes to {mine}, past its share of {share} ({flag}): delete files, "
                                "batches or conversations to make room")
        if total > self.max_bytes:
            over = {row.owner: int(row.bytes) - share for row in conn.execute(
                sa.select(USAGE.c.owner, USAGE.c.bytes).where(USAGE.c.bytes > share, USAGE.c.owner != TOTAL,
                                                              USAGE.c.owner != owner))}
            if over:
                total -= self._evict(conn, over, others, total - self.max_bytes)
            if total > self.max_bytes:
                total -= self._evict(conn, {owner: total - self.max_bytes}, others, total - self.max_bytes)
            if total > self.max_bytes and incoming is not None:
                raise StoreFull(f"the server's store is full: {incoming} bytes more would bring it to {total} bytes, "
                                f"past --store-max-bytes {self.max_bytes} (this API key holds {mine}): delete "
                                "files, batches or conversations to make room")

    @staticmethod
    def _evict(conn: Connection, excess: dict[str, int], others: sa.ColumnElement, cap: int) -> int:
        """Delete the oldest ended responses of the owners in ``excess`` (``{owner: bytes to
        free}``, each freed no further than that) that match ``others``, until ``cap`` bytes
        are freed in all or none is left; the bytes freed."""
        freed: dict[str, int] = {}
        doomed: list = []
        total, after = 0, None
        order = (RESPONSES.c.created_at, RESPONSES.c.id)
        where = sa.and_(RESPONSES.c.owner.in_(list(excess)), RESPONSES.c.status.not_in(RUNNING), others)
        while total < cap and any(v > 0 for v in excess.values()):
            query = sa.select(RESPONSES.c.id, RESPONSES.c.owner, RESPONSES.c.size, *order).where(where)
            if after is not None:
                query = query.where(sa.tuple_(*order) > sa.tuple_(*(sa.literal(v) for v in after)))
            rows = conn.execute(query.order_by(*order).limit(PAGE)).all()
            if not rows:
                break
            for row in rows:
                if total >= cap:
                    break
                if excess[row.owner] > 0:
                    doomed.append(row)
                    excess[row.owner] -= int(row.size)
                    total += int(row.size)
            after = (rows[-1].created_at, rows[-1].id)
        _delete(conn, doomed, freed)
        charge_each(conn, freed)
        return total
