"""``BatchStore``: batches (OpenAI's ``/v1/batches``, Anthropic's ``/v1/messages/batches``) and
their request lines, each line's result stored in the same transaction that marks it done.

Runners (one per server process, ``serving/batches/service.py``) claim pending lines with one
conditional ``UPDATE`` (atomic on SQLite and PostgreSQL, so two replicas never claim the same
line), keep their claims fresh while the lines run (``heartbeat``), and record each result only
if the line is not done yet. A line claimed by a process that died (SIGKILL, a lost replica) is
claimed again once its claim is ``lease_s`` old: after a restart a batch goes on where it
stopped, and no line is written twice.

A runner claims only the lines of the models its server serves (``claim(models=...)``): two
servers of different models on one database each run their own model's lines, and a line of a
model no server has waits until its batch expires (``expired``). A line refused for a while
(429, 503) is given back with a back-off (``retry_later``); each claim counts in ``attempts``,
so a line whose runs never end (its server dies on it) can be recorded as failed instead of
running forever.

Sizes: a batch's lines count against the owner's share when it is made, each result when it
is recorded (``complete``; a result that does not fit raises ``StoreFull``). An ending OpenAI
batch's output and error files are written a piece at a time (``Build``), each piece one
short transaction that also deletes the lines it holds, so the write lock is never held for
the whole files and no result is held twice; a builder that stops is taken over
(``take_build``). Blocking calls."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from glmserve.state.quota import Quota, StoreFull, charge
from glmserve.state.tables import BATCH_LINES, BATCHES, FILE_CHUNKS, FILES, db_now, dumps, keyset_page

RUNNING = ("in_progress", "cancelling")  # statuses whose lines runners take (cancelling: none new)
# an output file's line takes this many bytes beyond its result and custom_id (ids, status, keys:
# 171 in OpenAI's shape, compact): counted with the result, so that writing the file adds nothing
RECORD_BYTES = 180
# a line's answer when its result does not fit: the batch's errors say more (serving's stop_full)
FULL_ERROR = {"error": {"message": "the server's store is full for this API key: the batch stopped",
                        "type": "invalid_request_error", "param": None, "code": "store_full"}}
# bytes a line holds from the batch's creation for its answer: FULL_ERROR's line in an output
# file, so that a batch that stops for room still answers every line within the bound
LINE_RESERVE = RECORD_BYTES + len(dumps(FULL_ERROR))
FINALIZING = "finalizing"  # an OpenAI batch whose files are being written (OpenAI's status for it)


@dataclass(frozen=True, slots=True)
class ClaimedLine:
    """A line a runner claimed: its batch, owner and API, and its request (a JSON dict);
    ``lost``: how many earlier claims of it ended with nothing recorded and no refusal (their
    runner died or was stopped)."""

    id: int
    batch_id: str
    owner: str
    api: str
    custom_id: str
    request: dict[str, Any]
    lost: int = 0


@dataclass(slots=True)
class Build:
    """An ending OpenAI batch's files being written: ``status`` the batch's end, ``counts``
    ``(total, done, failed)`` when it began, ``files`` ``{"output_file_id" | "error_file_id":
    [file id, pieces written, bytes written]}``, ``after`` the last line written (from 0)."""

    status: str
    counts: list[int]
    files: dict[str, list]
    after: int = -1

    def text(self) -> str:
        return dumps(dataclasses.asdict(self))


class LostBuild(Exception):
    """Another server took over this batch's build (this builder was too slow)."""


@dataclass(frozen=True, slots=True)
class LineResult:
    line_no: int
    custom_id: str
    status_code: int | None  # None: not run (the batch was cancelled first)
    result: Any


class BatchStore:
    """Batches in ``database``; ``quota``: the size bounds a new batch's lines must fit (the
    database's ``ResponseStore.quota``; None: unbounded), their results counted as they come."""

    def __init__(self, database: sa.engine.Engine, quota: Quota | None = None) -> None:
        self.database = database
        self.quota = quota or Quota()

    def create(self, owner: str, batch_id: str, api: str, body: dict[str, Any],
               lines: list[tuple[str, dict[str, Any]]], expires_at: float | None = None) -> None:
        """A new batch (``body``: its object, ``body["status"]`` its status) of ``lines``
        (``(custom_id, request)`` in order), expiring at ``expires_at`` (epoch seconds). Raises
        ``StoreFull`` when the lines do not fit the owner's room."""
        rows = [{"batch_id": batch_id, "line_no": i, "custom_id": custom_id, "request": (text := dumps(request)),
                 "size": len(text) + len(custom_id.encode()) + LINE_RESERVE, "done": False, "attempts": 0,
                 "retries": 0,
                 "model": model if isinstance(model := request.get("model"), str) else None}
                for i, (custom_id, request) in enumerate(lines)]
        with self.database.begin() as conn:
            self.quota.reserve(conn, owner, sum(row["size"] for row in rows))
            conn.execute(sa.insert(BATCHES).values(id=batch_id, owner=owner, created_at=time.time(), api=api,
                                                   status=body["status"], body=dumps(body), expires_at=expires_at))
            if rows:
                conn.execute(sa.insert(BATCH_LINES), rows)

    def get(self, owner: str, batch_id: str, api: str) -> dict[str, Any] | None:
        with self.database.connect() as conn:
            row = conn.execute(sa.select(BATCHES.c.body).where(BATCHES.c.id == batch_id, BATCHES.c.owner == owner,
                                                               BATCHES.c.api == api)).first()
        return None if row is None else json.loads(row.body)

    def owner_of(self, batch_id: str) -> str | None:
        with self.database.connect() as conn:
            return conn.execute(sa.select(BATCHES.c.owner).where(BATCHES.c.id == batch_id)).scalar_one_or_none()

    def page(self, owner: str, api: str, after: str | None, limit: int) -> list[dict[str, Any]]:
        """Up to ``limit + 1`` of the owner's batches of ``api`` after the batch ``after``,
        newest first. Raises ``tables.UnknownCursor``."""
        mine = (BATCHES.c.owner == owner, BATCHES.c.api == api)
        cursor = None if after is None else sa.select(BATCHES.c.created_at, BATCHES.c.id).where(
            *mine, BATCHES.c.id == after)
        with self.database.connect() as conn:
            rows = keyset_page(conn, sa.select(BATCHES.c.body).where(*mine), (BATCHES.c.created_at, BATCHES.c.id),
                               cursor, limit, True)
        return [json.loads(row.body) for row in rows]

    def update(self, batch_id: str, body: dict[str, Any], when_status: tuple[str, ...] | None = None) -> bool:
        """Replace the batch's object (and status); ``when_status``: only if its status is one
        of these. Whether it was replaced."""
        query = sa.update(BATCHES).where(BATCHES.c.id == batch_id)
        if when_status is not None:
            query = query.where(BATCHES.c.status.in_(when_status))
        with self.database.begin() as conn:
            return conn.execute(query.values(status=body["status"], body=dumps(body))).rowcount > 0

    def delete(self, owner: str, batch_id: str, api: str) -> bool:
        with self.database.begin() as conn:
            charge(conn, owner, 0)  # the store's write lock
            gone = conn.execute(sa.delete(BATCHES).where(BATCHES.c.id == batch_id, BATCHES.c.owner == owner,
                                                         BATCHES.c.api == api))
            if gone.rowcount:
                _drop_lines(conn, owner, BATCH_LINES.c.batch_id == batch_id)
        return gone.rowcount > 0

    def claim(self, runner: str, n: int, lease_s: float, models: Collection[str] | None = None,
              running: Collection[int] = ()) -> list[ClaimedLine]:
        """Claim up to ``n`` pending lines of ``in_progress`` batches: lines nobody holds, or
        whose claim is older than ``lease_s`` (its runner died), past their back-off, shared
        out among the owners (API keys) that have such lines (``n // owners`` each, at least
        one, each owner's oldest batch first; what they leave goes to the oldest lines of any),
        so that one key's 50,000-line batch does not hold back another key's batch until it
        expires; ``models``: only lines asking for one of these (or for no model);
        ``running``: the lines the runner runs now, never handed back to it. Times are
        the database's (``db_now``); on PostgreSQL the lines picked are locked (``FOR UPDATE
        SKIP LOCKED``), so replicas claiming together take different lines instead of waiting."""
        lines = BATCH_LINES.c
        with self.database.begin() as conn:
            now = db_now(conn)
            batches = sa.select(BATCHES.c.id).where(BATCHES.c.status == "in_progress")
            free = sa.and_(sa.or_(lines.claimed_by.is_(None), lines.claimed_at < now - lease_s),
                           sa.or_(lines.not_before.is_(None), lines.not_before <= now))
            wanted = [lines.done.is_(False), free, lines.batch_id.in_(batches)]
            if running:
                wanted.append(lines.id.not_in(list(running)))
            if models is not None:
                wanted.append(sa.or_(lines.model.is_(None), lines.model.in_(list(models))))
            owners = [row.owner for row in conn.execute(
                sa.select(BATCHES.c.owner).where(BATCHES.c.id.in_(sa.select(lines.batch_id).where(*wanted)))
                .distinct())]
            if not owners:  # nothing to claim: the one statement of an idle look
                return []
            ids: list[int] = []
            for owner in sorted(owners) if len(owners) > 1 else ():  # each owner's share first
                ids += self._pick(conn, [*wanted, lines.batch_id.in_(batches.where(BATCHES.c.owner == owner))],
                                  max(1, n // len(owners)))
            if len(ids) < n:  # the rest (all of it, for one owner): the oldest lines of any
                ids += self._pick(conn, [*wanted, lines.id.not_in(ids)] if ids else wanted, n - len(ids))
            if not ids:
                return []
            conn.execute(sa.update(BATCH_LINES).where(lines.id.in_(ids), lines.done.is_(False), free)
                         .values(claimed_by=runner, claimed_at=now, not_before=None, attempts=lines.attempts + 1))
            rows = conn.execute(
                sa.select(lines.id, lines.batch_id, lines.custom_id, lines.request, lines.attempts, lines.retries,
                          BATCHES.c.owner, BATCHES.c.api)
                .join(BATCHES, BATCHES.c.id == lines.batch_id)
                .where(lines.id.in_(ids), lines.claimed_by == runner, lines.claimed_at == now)
                .order_by(lines.id))
            return [ClaimedLine(r.id, r.batch_id, r.owner, r.api, r.custom_id, json.loads(r.request),
                                r.attempts - r.retries - 1) for r in rows]

    @staticmethod
    def _pick(conn, wanted: list, n: int) -> list[int]:
        """The ids of up to ``n`` lines matching ``wanted``, oldest first; on PostgreSQL locked,
        skipping lines another replica's claim holds locked."""
        pick = sa.select(BATCH_LINES.c.id).where(*wanted).order_by(BATCH_LINES.c.id).limit(n)
        if conn.dialect.name == "postgresql":
            pick = pick.with_for_update(skip_locked=True)
        return [row.id for row in conn.execute(pick)]

    def retry_later(self, runner: str, line_id: int, backoff_s: Callable[[int], float]) -> None:
        """Give back ``runner``'s claim on a line that was refused for now (429, 503): it is
        claimed again after ``backoff_s(retries)`` seconds (``retries``: its refusals so far,
        this one included)."""
        lines = BATCH_LINES.c
        with self.database.begin() as conn:
            retries = conn.execute(sa.select(lines.retries).where(lines.id == line_id)).scalar_one() + 1
            conn.execute(sa.update(BATCH_LINES).where(lines.id == line_id, lines.claimed_by == runner,
                                                      lines.done.is_(False))
                         .values(claimed_by=None, claimed_at=None, retries=retries,
                                 not_before=db_now(conn) + backoff_s(retries)))

    def heartbeat(self, runner: str, line_ids: list[int]) -> None:
        """Keep ``runner``'s claims on ``line_ids`` fresh."""
        if line_ids:
            with self.database.begin() as conn:
                conn.execute(sa.update(BATCH_LINES).where(BATCH_LINES.c.id.in_(line_ids),
                                                          BATCH_LINES.c.claimed_by == runner)
                             .values(claimed_at=db_now(conn)))

    def release(self, runner: str, line_ids: list[int]) -> None:
        """Give up ``runner``'s claims on ``line_ids`` (a server stopping): others take them at
        once, and the claim does not count as a lost run."""
        if line_ids:
            with self.database.begin() as conn:
                conn.execute(sa.update(BATCH_LINES).where(BATCH_LINES.c.id.in_(line_ids),
                                                          BATCH_LINES.c.claimed_by == runner,
                                                          BATCH_LINES.c.done.is_(False))
                             .values(claimed_by=None, claimed_at=None, attempts=BATCH_LINES.c.attempts - 1))

    def complete(self, line_id: int, owner: str, status_code: int, result: Any) -> bool:
        """Record a line's result (``owner``: its batch's), unless it is done already; whether
        it was recorded. Raises ``StoreFull`` when the result does not fit the owner's share or
        the store: the line is then recorded with ``FULL_ERROR`` instead (a 400 ``store_full``,
        within the ``LINE_RESERVE`` it has held since the batch was made)."""
        try:
            return self._record(line_id, owner, status_code, dumps(result))
        except StoreFull:
            if self._record(line_id, owner, 400, dumps(FULL_ERROR)):
                raise
            return False

    def _record(self, line_id: int, owner: str, status_code: int, text: str) -> bool:
        extra = max(0, len(text) + RECORD_BYTES - LINE_RESERVE)  # beyond what the line holds already
        with self.database.begin() as conn:
            charge(conn, owner, 0)  # the store's write lock
            done = conn.execute(sa.update(BATCH_LINES).where(BATCH_LINES.c.id == line_id,
                                                             BATCH_LINES.c.done.is_(False))
                                .values(done=True, status_code=status_code, result=text,
                                        size=BATCH_LINES.c.size + extra)).rowcount > 0
            if done and extra:
                self.quota.reserve(conn, owner, extra)
        return done

    def counts(self, batch_id: str) -> tuple[int, int, int, int]:
        """``(total, done, failed, in flight)`` lines of the batch (failed: done with a status
        that is not 200; in flight: claimed, not done, claim younger than a minute)."""
        ok = sa.case((sa.and_(BATCH_LINES.c.done.is_(True), BATCH_LINES.c.status_code != 200), 1), else_=0)
        done = sa.case((BATCH_LINES.c.done.is_(True), 1), else_=0)
        with self.database.connect() as conn:
            running = sa.case((sa.and_(BATCH_LINES.c.done.is_(False), BATCH_LINES.c.claimed_by.is_not(None),
                                       BATCH_LINES.c.claimed_at > db_now(conn) - 60), 1), else_=0)
            query = sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(done), 0),
                              sa.func.coalesce(sa.func.sum(ok), 0), sa.func.coalesce(sa.func.sum(running), 0)
                              ).where(BATCH_LINES.c.batch_id == batch_id)
            total, n_done, failed, in_flight = conn.execute(query).one()
        return int(total), int(n_done), int(failed), int(in_flight)

    def results_page(self, batch_id: str, after_line: int = -1, limit: int = 1000) -> list[LineResult]:
        """Up to ``limit`` lines after line ``after_line`` (their number in the input, from 0),
        in the input's order, with their results (None where not run)."""
        query = (sa.select(BATCH_LINES.c.line_no, BATCH_LINES.c.custom_id, BATCH_LINES.c.status_code,
                           BATCH_LINES.c.result, BATCH_LINES.c.done)
                 .where(BATCH_LINES.c.batch_id == batch_id, BATCH_LINES.c.line_no > after_line)
                 .order_by(BATCH_LINES.c.line_no).limit(limit))
        with self.database.connect() as conn:
            return [LineResult(r.line_no, r.custom_id, r.status_code if r.done else None,
                               json.loads(r.result) if r.done else None) for r in conn.execute(query)]

    def unfinished(self) -> bool:
        """Whether a batch is still worked on (``RUNNING``, or its files being written)."""
        with self.database.connect() as conn:
            return conn.execute(sa.select(BATCHES.c.id).where(BATCHES.c.status.in_((*RUNNING, FINALIZING)))
                                .limit(1)).first() is not None

    def ready(self, lease_s: float, limit: int) -> list[tuple[str, bool]]:
        """Up to ``limit`` batches to end now, as ``(id, expired)``: ``in_progress`` with every
        line done, ``cancelling`` with no line running (claimed within a minute), past their
        window (``expired``), or ``finalizing`` with no piece written for ``lease_s`` (their
        builder stopped). One query, whatever the number of batches waiting on lines."""
        lines, batches = BATCH_LINES.c, BATCHES.c
        with self.database.connect() as conn:
            now = db_now(conn)

            def no_line(*where: sa.ColumnElement) -> sa.ColumnElement:
                return ~sa.exists().where(lines.batch_id == batches.id, lines.done.is_(False), *where)
            expired = sa.and_(batches.expires_at.is_not(None), batches.expires_at <= time.time())
            query = sa.select(batches.id, expired.label("expired")).where(sa.or_(
                sa.and_(batches.status.in_(RUNNING), expired),
                sa.and_(batches.status == "in_progress", no_line()),
                sa.and_(batches.status == "cancelling", no_line(lines.claimed_by.is_not(None),
                                                                  lines.claimed_at > now - 60)),
                sa.and_(batches.status == FINALIZING, batches.build_at < now - lease_s)))
            return [(r.id, bool(r.expired)) for r in conn.execute(query.order_by(batches.created_at).limit(limit))]

    # --- an ending OpenAI batch's files, a piece at a time ---------------------------------

    def begin_build(self, batch_id: str, body: dict[str, Any], build: Build, from_status: tuple[str, ...]) -> str | None:
        """Make the batch ``finalizing`` (``body``: its object then) if its status is one of
        ``from_status``, with ``build`` to do; the build's text (what ``write_piece`` and
        ``end_build`` check) or None when another server ended or began ending it first."""
        text = build.text()
        with self.database.begin() as conn:
            ok = conn.execute(sa.update(BATCHES).where(BATCHES.c.id == batch_id, BATCHES.c.status.in_(from_status))
                              .values(status=FINALIZING, body=dumps(body), build=text, build_at=db_now(conn)))
        return text if ok.rowcount else None

    def take_build(self, batch_id: str, lease_s: float) -> tuple[str, Build] | None:
        """Take over the build of a ``finalizing`` batch whose builder wrote nothing for
        ``lease_s`` (it stopped): the build's text and state, or None."""
        with self.database.begin() as conn:
            now = db_now(conn)
            row = conn.execute(sa.select(BATCHES.c.build, BATCHES.c.build_at).where(
                BATCHES.c.id == batch_id, BATCHES.c.status == FINALIZING, BATCHES.c.build_at < now - lease_s)).first()
            if row is None or row.build is None:
                return None
            ok = conn.execute(sa.update(BATCHES).where(BATCHES.c.id == batch_id, BATCHES.c.build == row.build,
                                                       BATCHES.c.build_at == row.build_at).values(build_at=now))
        return (row.build, Build(**json.loads(row.build))) if ok.rowcount else None

    def write_piece(self, batch_id: str, owner: str, seen: str, build: Build, pieces: dict[str, list[bytes]],
                    last_line: int) -> str:
        """One piece of a build, one transaction: ``pieces`` (``{key: [bytes, ...]}``, each at
        most ``files.CHUNK_BYTES``) appended to the build's files, the lines up to ``last_line``
        deleted (their results are in the files now), the bytes counted (never refused: a
        line's result was counted with ``RECORD_BYTES``, its line in the file's size, and its
        request is freed), ``build`` (the state after
        this piece) recorded. The new state's text; raises ``LostBuild`` when the recorded
        state is not ``seen`` (another server took the build over)."""
        text = build.text()
        with self.database.begin() as conn:
            charge(conn, owner, 0)  # the store's write lock
            if conn.execute(sa.update(BATCHES).where(BATCHES.c.id == batch_id, BATCHES.c.build == seen)
                            .values(build=text, build_at=db_now(conn))).rowcount == 0:
                raise LostBuild(batch_id)
            added = 0
            for key, datas in pieces.items():
                file_id, seq = build.files[key][0], build.files[key][1] - len(datas)
                for i, data in enumerate(datas):
                    conn.execute(sa.insert(FILE_CHUNKS).values(file_id=file_id, seq=seq + i, data=data))
                    added += len(data)
            charge(conn, owner, added)
            _drop_lines(conn, owner, sa.and_(BATCH_LINES.c.batch_id == batch_id, BATCH_LINES.c.line_no <= last_line))
        return text

    def end_build(self, batch_id: str, owner: str, seen: str, body: dict[str, Any],
                  files: list[tuple[str, str, int]]) -> bool:
        """End a build in one transaction: the batch becomes ``body`` (its end), its files
        ``(id, filename, bytes)`` are listed (their pieces were written by ``write_piece``), the
        lines left deleted. Whether it ended (False: another server took the build over)."""
        with self.database.begin() as conn:
            charge(conn, owner, 0)  # the store's write lock
            if conn.execute(sa.update(BATCHES).where(BATCHES.c.id == batch_id, BATCHES.c.build == seen).values(
                    status=body["status"], body=dumps(body), build=None, build_at=None)).rowcount == 0:
                return False
            now = time.time()
            for file_id, filename, size in files:
                conn.execute(sa.insert(FILES).values(id=file_id, owner=owner, created_at=now, purpose="batch_output",
                                                     filename=filename, bytes=size))
            _drop_lines(conn, owner, BATCH_LINES.c.batch_id == batch_id)
        return True

    def body(self, batch_id: str) -> dict[str, Any] | None:
        with self.database.connect() as conn:
            row = conn.execute(sa.select(BATCHES.c.body).where(BATCHES.c.id == batch_id)).first()
        return None if row is None else json.loads(row.body)


def _drop_lines(conn: Connection, owner: str, where: sa.ColumnElement) -> None:
    """Delete the batch lines matching ``where`` (all ``owner``'s) and take their bytes off its use."""
    size = conn.execute(sa.select(sa.func.coalesce(sa.func.sum(BATCH_LINES.c.size), 0)).where(where)).scalar_one()
    conn.execute(sa.delete(BATCH_LINES).where(where))
    charge(conn, owner, -int(size))
