"""``ResponseStore``: stored ``/v1/responses`` objects, each with the input items it was made
from, scoped to an owner (the API key that created it), kept ``ttl_s`` seconds and within
``max_bytes`` in all (the oldest go first). A ``queued`` or ``in_progress`` response (a
background run) carries a heartbeat, renewed by the server that runs it (``heartbeat``), which
tells a run whose server died (``fail_lost``) from one still running elsewhere. Blocking calls:
the serving layer runs them in a thread (``asyncio.to_thread``)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from glmserve.state.quota import RUNNING, TOTAL, Quota, charge, delete_responses, stored_bytes
from glmserve.state.tables import RESPONSES, db_now, dumps


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """A stored response: ``body`` the response object (a JSON dict), ``input_items`` every
    input item it was made from (those of the responses it continued first), oldest first;
    ``heartbeat_at``: when the server running it (``body["status"]`` in ``RUNNING``) last said
    it was alive (epoch seconds; None: not running); ``read_at``: the database's clock when it was
    read (``db_now``: the heartbeat's age is ``read_at - heartbeat_at`` whatever this host's
    clock says)."""

    body: dict[str, Any]
    input_items: list[dict[str, Any]]
    heartbeat_at: float | None = None
    read_at: float | None = None


class ResponseStore:
    """Responses in the state ``database`` (``state.open_database``, a SQLAlchemy engine):
    ``ttl_s`` seconds after it was made a response is gone (unreadable at once, deleted by ``purge``); past
    ``max_bytes`` stored in all, or an owner past its share (``max_bytes_per_key``; None: the
    total over ``keys``, the server's API keys), the oldest are deleted to make room
    (``quota.Quota``, which the other stores of the database share)."""

    def __init__(self, database: Engine, ttl_s: float, max_bytes: int, max_bytes_per_key: int | None = None,
                 keys: int = 1) -> None:
        self.database, self.ttl_s = database, ttl_s
        self.quota = Quota(max_bytes, max_bytes_per_key, keys)

    def put(self, owner: str, body: dict[str, Any], input_items: list[dict[str, Any]],
            unless_cancelled: bool = False, update_only: bool = False, refusable: bool = False) -> bool:
        """Insert the response ``body`` (``body["id"]`` its key) or replace the one stored under
        its id (a background run's later states), then keep the bounds (``Quota.trim``);
        ``unless_cancelled``: leave a stored ``cancelled`` response as it is (a run cancelled
        from another replica); ``update_only``: write it only over a stored one (a background
        run's later state: a response deleted meanwhile stays deleted); ``refusable``: a new
        response is refused when it does not fit (``Quota.reserve``: raises ``StoreFull``), as
        a background run's first state is, before it runs (a running one is never evicted).
        Whether it was written."""
        text, items = dumps(body), dumps(input_items)
        now = time.time()
        row = {"owner": owner, "status": body.get("status", ""), "body": text, "input_items": items,
               "size": len(text.encode()) + len(items.encode()),
               "heartbeat_at": now if body.get("status") in RUNNING else None}
        mine = sa.and_(RESPONSES.c.id == body["id"], RESPONSES.c.owner == owner)
        with self.database.begin() as conn:
            charge(conn, owner, 0)  # the store's write lock, before anything is read
            if row["heartbeat_at"] is not None:
                row["heartbeat_at"] = db_now(conn)
            old = conn.execute(sa.select(RESPONSES.c.status, RESPONSES.c.size).where(mine)).first()
            if old is None and update_only or old is not None and unless_cancelled and old.status == "cancelled":
                return False  # deleted or cancelled meanwhile
            if old is None:
                conn.execute(sa.insert(RESPONSES).values(id=body["id"], created_at=now, expires_at=now + self.ttl_s,
                                                         **row))
            else:
                conn.execute(sa.update(RESPONSES).where(mine).values(**row))
            if old is None and refusable:
                self.quota.reserve(conn, owner, row["size"])
            else:
                self.quota.trim(conn, owner, row["size"] - (0 if old is None else int(old.size)), body["id"])
        return True

    def status(self, owner: str, response_id: str) -> str | None:
        """The stored status of ``response_id`` (None: not stored)."""
        with self.database.connect() as conn:
            return conn.execute(sa.select(RESPONSES.c.status).where(
                RESPONSES.c.id == response_id, RESPONSES.c.owner == owner)).scalar_one_or_none()

    def get(self, owner: str, response_id: str) -> StoredResponse | None:
        """The response ``response_id`` if ``owner`` stored it and it has not expired."""
        query = sa.select(RESPONSES.c.body, RESPONSES.c.input_items, RESPONSES.c.heartbeat_at).where(
            RESPONSES.c.id == response_id, RESPONSES.c.owner == owner, RESPONSES.c.expires_at > time.time())
        with self.database.connect() as conn:
            row = conn.execute(query).first()
            read_at = db_now(conn)
        return None if row is None else StoredResponse(json.loads(row.body), json.loads(row.input_items),
                                                       row.heartbeat_at, read_at)

    def heartbeat(self, response_ids: list[str]) -> None:
        """Renew the heartbeat of these responses (the runs this server runs) that are still
        running."""
        if response_ids:
            with self.database.begin() as conn:
                conn.execute(sa.update(RESPONSES).where(RESPONSES.c.id.in_(response_ids),
                                                        RESPONSES.c.status.in_(RUNNING)).values(
                    heartbeat_at=db_now(conn)))

    def cancel(self, owner: str, cancelled: dict[str, Any]) -> bool:
        """Store ``cancelled`` (the response, ``cancelled``) if its stored run is still going
        (``RUNNING``): a run that ended meanwhile keeps its end. Whether it was written."""
        return self._end(owner, sa.and_(RESPONSES.c.id == cancelled["id"], RESPONSES.c.owner == owner,
                                        RESPONSES.c.status.in_(RUNNING)), cancelled)

    def fail_lost(self, owner: str, seen: StoredResponse, failed: dict[str, Any]) -> bool:
        """Store ``failed`` (the response, ended) in place of ``seen``, a run whose server
        stopped, if nothing changed it since it was read (no newer heartbeat or state); whether
        it was written."""
        beat = (RESPONSES.c.heartbeat_at.is_(None) if seen.heartbeat_at is None
                else RESPONSES.c.heartbeat_at == seen.heartbeat_at)
        return self._end(owner, sa.and_(RESPONSES.c.id == failed["id"], RESPONSES.c.owner == owner, beat,
                                        RESPONSES.c.status == seen.body.get("status")), failed)

    def _end(self, owner: str, where: sa.ColumnElement, ended: dict[str, Any]) -> bool:
        """Write ``ended`` (a run's last state: no heartbeat) over the response matching
        ``where``, its input items kept, its size counted; whether one matched."""
        text = dumps(ended)
        with self.database.begin() as conn:
            charge(conn, owner, 0)  # the store's write lock
            old = conn.execute(sa.select(RESPONSES.c.size, RESPONSES.c.body).where(where)).first()
            if old is None:
                return False
            size = int(old.size) - len(old.body.encode()) + len(text.encode())
            conn.execute(sa.update(RESPONSES).where(where).values(status=ended["status"], body=text,
                                                                  heartbeat_at=None, size=size))
            charge(conn, owner, size - int(old.size))
        return True

    def delete(self, owner: str, response_id: str) -> bool:
        """Delete ``response_id`` if ``owner`` stored it; whether there was one to delete."""
        with self.database.begin() as conn:
            charge(conn, owner, 0)  # the store's write lock
            return delete_responses(conn, sa.and_(RESPONSES.c.id == response_id, RESPONSES.c.owner == owner,
                                                  RESPONSES.c.expires_at > time.time())) > 0

    def purge(self, now: float | None = None, page: int = 5000) -> int:
        """Delete the responses expired at ``now`` (default: the clock), ``page`` at most per
        transaction (the write lock is given up between them); how many."""
        expired = RESPONSES.c.expires_at <= (now or time.time())
        count = 0
        while True:
            with self.database.begin() as conn:
                charge(conn, TOTAL, 0)  # the store's write lock
                gone = delete_responses(conn, expired, page)
            count += gone
            if gone < page:
                return count

    def total_bytes(self) -> int:
        """Bytes stored (``quota.stored_bytes``), all owners together."""
        with self.database.connect() as conn:
            return stored_bytes(conn)
