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

from glmserve.state.quota import Quota, stored_bytes
from glmserve.state.tables import RESPONSES, db_now, dumps

RUNNING = ("queued", "in_progress")  # the statuses of a background run not yet ended


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
    ``max_bytes`` stored in all (or ``max_bytes_per_key`` by one owner), the oldest are deleted
    to make room (``quota.Quota``, which the other stores of the database share)."""

    def __init__(self, database: Engine, ttl_s: float, max_bytes: int, max_bytes_per_key: int | None = None) -> None:
        self.database, self.ttl_s = database, ttl_s
        self.quota = Quota(max_bytes, max_bytes_per_key)

    def put(self, owner: str, body: dict[str, Any], input_items: list[dict[str, Any]],
            unless_cancelled: bool = False) -> bool:
        """Insert the response ``body`` (``body["id"]`` its key) or replace the one stored under
        its id (a background run's later states), then keep the bounds (``Quota.trim``);
        ``unless_cancelled``: leave a stored ``cancelled`` response as it is (a run cancelled
        from another replica). Whether it was written."""
        text, items = dumps(body), dumps(input_items)
        now = time.time()
        row = {"owner": owner, "status": body.get("status", ""), "body": text, "input_items": items,
               "size": len(text.encode()) + len(items.encode()),
               "heartbeat_at": now if body.get("status") in RUNNING else None}
        mine = sa.and_(RESPONSES.c.id == body["id"], RESPONSES.c.owner == owner)
        with self.database.begin() as conn:
            if row["heartbeat_at"] is not None:
                row["heartbeat_at"] = db_now(conn)
            query = sa.update(RESPONSES).where(mine)
            if unless_cancelled:
                query = query.where(RESPONSES.c.status != "cancelled")
            if conn.execute(query.values(**row)).rowcount == 0:
                if conn.execute(sa.select(RESPONSES.c.id).where(mine)).first() is not None:
                    return False  # cancelled meanwhile
                conn.execute(sa.insert(RESPONSES).values(id=body["id"], created_at=now, expires_at=now + self.ttl_s,
                                                         **row))
            self.quota.trim(conn, owner, body["id"])
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
        text = dumps(cancelled)
        with self.database.begin() as conn:
            return conn.execute(sa.update(RESPONSES).where(
                RESPONSES.c.id == cancelled["id"], RESPONSES.c.owner == owner, RESPONSES.c.status.in_(RUNNING))
                .values(status=cancelled["status"], body=text, heartbeat_at=None,
                        size=len(text.encode()) + sa.func.length(RESPONSES.c.input_items))).rowcount > 0

    def fail_lost(self, owner: str, seen: StoredResponse, failed: dict[str, Any]) -> bool:
        """Store ``failed`` (the response, ended) in place of ``seen``, a run whose server
        stopped, if nothing changed it since it was read (no newer heartbeat or state); whether
        it was written."""
        text = dumps(failed)
        beat = (RESPONSES.c.heartbeat_at.is_(None) if seen.heartbeat_at is None
                else RESPONSES.c.heartbeat_at == seen.heartbeat_at)
        with self.database.begin() as conn:
            return conn.execute(sa.update(RESPONSES).where(
                RESPONSES.c.id == failed["id"], RESPONSES.c.owner == owner, beat,
                RESPONSES.c.status == seen.body.get("status")).values(
                    status=failed["status"], body=text, heartbeat_at=None,
                    size=len(text.encode()) + len(dumps(seen.input_items).encode()))).rowcount > 0

    def delete(self, owner: str, response_id: str) -> bool:
        """Delete ``response_id`` if ``owner`` stored it; whether there was one to delete."""
        with self.database.begin() as conn:
            gone = conn.execute(sa.delete(RESPONSES).where(RESPONSES.c.id == response_id, RESPONSES.c.owner == owner,
                                                           RESPONSES.c.expires_at > time.time()))
        return gone.rowcount > 0

    def purge(self, now: float | None = None) -> int:
        """Delete the responses expired at ``now`` (default: the clock); how many."""
        with self.database.begin() as conn:
            gone = conn.execute(sa.delete(RESPONSES).where(RESPONSES.c.expires_at <= (now or time.time())))
        return gone.rowcount

    def total_bytes(self) -> int:
        """Bytes stored (``quota.stored_bytes``), all owners together."""
        with self.database.connect() as conn:
            return stored_bytes(conn)
