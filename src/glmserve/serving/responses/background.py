"""Background ``/v1/responses`` runs (``background: true``) on one server: each run goes on
without the connection, its states stored as they change (``in_progress``, then
``completed``/``incomplete``/``failed``, or ``cancelled``: by ``POST .../cancel``, which aborts it
in the engine; made on another replica, the run finds it within ``CANCEL_CHECK_S`` and stops);
its events are kept for streams that resume (``follow``) while it runs and for
``EVENTS_KEPT_S`` after (at most ``MAX_RUNS_KEPT`` finished runs' and ``MAX_EVENTS_KEPT`` of
their events, the oldest run's dropped first); the server renews its running runs' heartbeat every ``HEARTBEAT_S``
(``heartbeat_forever``), by which other servers tell a run whose server died
(``stored.LOST_AFTER_S``). ``stored.ResponseStorage`` starts the runs and reads them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable

from glmserve.protocol.errors import ErrorResponse
from glmserve.protocol.responses import ResponseEvent
from glmserve.serving.responses.run_events import Follow, Run
from glmserve.state import ResponseStore

log = logging.getLogger("glmserve.responses")

EVENTS_KEPT_S = 600.0  # how long a finished background run's events stay for resumed streams
MAX_RUNS_KEPT = 256  # finished runs whose events are kept, at most
MAX_EVENTS_KEPT = 100_000  # events of finished runs kept, all together (a token's delta is one)
CANCEL_CHECK_S = 1.0  # how often a background run looks for a cancel made on another replica
TERMINAL = ("completed", "incomplete", "failed", "cancelled")
HEARTBEAT_S = 10.0  # how often a server renews the heartbeat of the background runs it runs


class BackgroundRuns:
    """The background runs of one server over ``store`` (where each run's states are kept and
    a cancel from another replica is read): ``launch`` one, ``follow`` its events, ``running``
    says whether it runs here, ``cancel`` one running here, ``heartbeat_forever`` and
    ``close``."""

    def __init__(self, store: ResponseStore | None) -> None:
        self.store = store
        self._runs: OrderedDict[str, Run] = OrderedDict()

    def launch(self, owner: str, created: ResponseEvent, body: dict,
               events: AsyncIterator[ResponseEvent | ErrorResponse],
               keep: Callable[[dict], Awaitable[None]], put: Callable[[dict], Awaitable[bool]],
               release: Callable[[], None]) -> None:
        """Run ``events`` (after ``created``, the ``response.created`` event whose response is
        ``body``, stored ``queued``) in a task of its own: ``put`` stores a state while it runs,
        ``keep`` the last; ``release`` is called when it ends."""
        run = Run(owner)
        self._runs[body["id"]] = run
        run.record(created.model_copy(update={"response": body}))
        run.task = asyncio.create_task(self._run(run, body, events, keep, put, release))

    def running(self, response_id: str, owner: str | None = None) -> bool:
        """Whether ``response_id`` runs on this server (for ``owner``, when given)."""
        run = self._runs.get(response_id)
        return (run is not None and (owner is None or run.owner == owner) and run.task is not None
                and not run.task.done())

    async def cancel(self, response_id: str) -> bool:
        """Cancel the run of ``response_id`` when it runs here (it then ends stored as
        ``cancelled``); False when it does not."""
        run = self._runs.get(response_id)
        if run is None or run.task is None or run.task.done():
            return False
        run.task.cancel()
        await asyncio.gather(run.task, return_exceptions=True)
        return True

    async def _run(self, run: Run, body: dict, events: AsyncIterator[ResponseEvent | ErrorResponse],
                   keep: Callable[[dict], Awaitable[None]], put: Callable[[dict], Awaitable[bool]],
                   release: Callable[[], None]) -> None:
        checked = time.monotonic()
        try:
            async for event in events:
                if time.monotonic() - checked > CANCEL_CHECK_S:  # cancelled on another replica?
                    checked = time.monotonic()
                    status = await asyncio.to_thread(self.store.status, run.owner, body["id"])
                    if status in ("cancelled", None):  # None: deleted through another replica
                        raise asyncio.CancelledError
                if event.type == "response.in_progress":
                    body = {**body, "status": "in_progress"}
                    await put(body)
                elif event.type in ("response.completed", "response.incomplete"):
                    body = event.response
                elif event.type == "error":
                    body = {**body, "status": "failed", "error": {"code": event.code or "server_error",
                                                                  "message": event.message}}
                run.record(event)  # an error event is followed by response.failed
                if event.type == "error":
                    run.record(ResponseEvent(type="response.failed", sequence_number=event.sequence_number + 1,
                                                    response=body))
        except asyncio.CancelledError:
            body = {**body, "status": "cancelled"}
            run.record(ResponseEvent(type="response.cancelled",
                                            sequence_number=len(run.events), response=body))
        except Exception as exc:  # noqa: BLE001 (the run is its own request: it must end stored)
            log.exception("background response %s failed", body["id"])
            body = {**body, "status": "failed", "error": {"code": "server_error", "message": str(exc)}}
            run.record(ResponseEvent(type="response.failed", sequence_number=len(run.events),
                                            response=body))
        finally:
            with contextlib.suppress(Exception):
                await events.aclose()
            release()
            try:
                await keep(body)
            except Exception:  # noqa: BLE001
                log.exception("background response %s: its last state was not stored", body["id"])
            run.finished_at = time.monotonic()
            run.changed.set()
            self._forget_old_runs()

    def _forget_old_runs(self) -> None:
        now = time.monotonic()
        finished = [rid for rid, run in self._runs.items() if run.finished_at is not None]
        for rid in finished[:max(0, len(finished) - MAX_RUNS_KEPT)]:
            del self._runs[rid]
        finished = finished[max(0, len(finished) - MAX_RUNS_KEPT):]
        kept = sum(len(self._runs[rid].events) for rid in finished)
        while finished and kept > MAX_EVENTS_KEPT:  # the oldest go first, whatever their age
            kept -= len(self._runs.pop(finished.pop(0)).events)
        for rid in finished:
            run = self._runs.get(rid)
            if run is not None and now - run.finished_at > EVENTS_KEPT_S:
                del self._runs[rid]

    def follow(self, response_id: str, owner: str, starting_after: int) -> AsyncIterator[ResponseEvent] | None:
        """The events of the background run ``response_id`` after sequence number
        ``starting_after``, then each new one until the run ends; None when its events are not
        kept here (not ``owner``'s, not run here, or no longer kept)."""
        run = self._runs.get(response_id)
        return None if run is None or run.owner != owner else Follow(run, starting_after)

    async def heartbeat_forever(self) -> None:
        """Renew the heartbeat of this server's running background runs every ``HEARTBEAT_S``
        seconds (the server's lifetime)."""
        while True:
            await asyncio.sleep(HEARTBEAT_S)
            live = [rid for rid, run in self._runs.items() if run.task is not None and not run.task.done()]
            if not live:  # no round trip for nothing (an idle server)
                continue
            try:
                await asyncio.to_thread(self.store.heartbeat, live)
            except Exception:  # noqa: BLE001 (a database hiccup must not end the task)
                log.exception("renewing background runs' heartbeats failed")

    async def close(self) -> None:
        """Cancel the background runs still going (stored as ``cancelled``)."""
        running = [run.task for run in self._runs.values() if run.task is not None and not run.task.done()]
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
