"""``BatchRunner``: runs the lines of the batches in the state database, one runner per server
process, at a lower priority than interactive requests (``serving/batches/service.py`` says how; the
claims that make it durable are ``state/batches.py``'s). ``Activity`` counts the interactive
generation requests in flight, which the runner yields to."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Collection
from typing import Any

from glmserve.serving.batches.service import BUILD_LEASE_S, BatchService
from glmserve.state import ClaimedLine, StoreFull

log = logging.getLogger("glmserve.batches")

LEASE_S = 30.0  # a claim not renewed for this long is taken to be a dead runner's (default of --batch-lease)
QUIET_S = 1.0  # no new line starts until interactive requests have left the engine alone this long
TRANSIENT = (429, 503, 529)  # refusals for now (queue full, model busy, overloaded): retried, never a result
MAX_LOST = 3  # a line whose runs ended this many times with nothing recorded (its server died) is failed
MAX_BACKOFF_S = 60.0
SWEEP_BATCHES = 20  # batches ended per pass of the loop at most
IDLE_POLL_S = 10.0  # no batch unfinished in the database: looked at again this often (or when woken)


def backoff_s(retries: int) -> float:
    """Seconds before a line refused ``retries`` times is claimed again: 1, 2, 4, ... at most 60."""
    return min(MAX_BACKOFF_S, 2.0 ** (retries - 1))


def lost_error(line: ClaimedLine) -> dict[str, Any]:
    """The error recorded for a line whose earlier runs all ended without a result."""
    return {"error": {"message": f"the line was started {line.lost} times and its run ended each time without a "
                                 "result (its server stopped): it is not run again", "type": "server_error",
                      "param": None, "code": "batch_line_lost"}}

# (owner, url, body) -> (HTTP status, JSON body) as the route would answer
Dispatch = Callable[[str, str, dict[str, Any]], Awaitable[tuple[int, dict[str, Any]]]]


class Activity:
    """How many interactive generation requests are in flight (the routes count them); the
    batch runner yields to them."""

    def __init__(self) -> None:
        self.count = 0
        self.changed = asyncio.Event()
        self.last_left = float("-inf")  # time.monotonic() when the last request left

    def quiet_for(self) -> float:
        """Seconds since the last interactive request left (0 while one is in flight)."""
        return 0.0 if self.count else time.monotonic() - self.last_left

    def enter(self) -> Callable[[], None]:
        """Count one request in; the returned function counts it out (once)."""
        self.count += 1
        done = False

        def leave() -> None:
            nonlocal done
            if not done:
                done = True
                self.count -= 1
                self.last_left = time.monotonic()
                if not self.count:  # quiet from now on: the runner may start lines after QUIET_S
                    self.changed.set()
        return leave


class BatchRunner:
    """Runs the batches' lines in the background of one server process (see module docstring).
    ``capacity()``: how many lines may run at once (the engines' batch size); ``activity``:
    interactive requests in flight; ``models()``: the names this server serves (models,
    aliases, LoRA adapters): only lines for those are claimed (None: every line).

    A line is run once to a recorded result: a transient refusal (``TRANSIENT``) gives the line
    back with a back-off (``backoff_s``), a dispatch that raises records a 500-class error, and
    a line whose runs were lost ``MAX_LOST`` times is recorded as failed without running.

    The database is looked at every ``poll_s`` seconds while a batch is unfinished there, and
    every ``idle_poll_s`` while none is (an idle server: no query a second); the service wakes
    the runner at once for a batch created or cancelled through it, so only a batch another
    server created on the same database waits up to ``idle_poll_s`` for this runner (its own
    server's runner starts it at once). A line claimed here is claimed for ``lease_s`` seconds
    (``--batch-lease``), renewed every third of it while it runs."""

    def __init__(self, service: BatchService, dispatch: Dispatch, capacity: Callable[[], int],
                 activity: Activity, poll_s: float = 1.0, models: Callable[[], Collection[str]] | None = None,
                 idle_poll_s: float = IDLE_POLL_S, lease_s: float = LEASE_S) -> None:
        self.service, self.dispatch, self.capacity, self.activity = service, dispatch, capacity, activity
        self.lease_s = lease_s
        self.poll_s, self.idle_poll_s = poll_s, idle_poll_s
        self.models = models
        self.runner_id = uuid.uuid4().hex
        self._running: dict[int, asyncio.Task] = {}
        self._wake = asyncio.Event()
        service.wake = self._wake.set

    async def run_forever(self) -> None:
        beating = asyncio.create_task(self._beat_forever())
        try:
            await self._loop()
        finally:
            beating.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beating

    async def _beat_forever(self) -> None:
        """Keep the claims of the lines running here fresh every ``lease_s / 3``, on a timer of
        its own: a slow pass of the loop (a batch's files being written, a busy database) does
        not let them lapse."""
        while True:
            await asyncio.sleep(self.lease_s / 3)
            try:
                if self._running:
                    await asyncio.to_thread(self.service.batches.heartbeat, self.runner_id, list(self._running))
            except Exception:  # noqa: BLE001 (a database hiccup: the next beat tries again)
                log.exception("renewing batch lines' claims failed")

    async def _loop(self) -> None:
        store = self.service.batches
        last_finish = 0.0
        was_running, woken = False, True
        idle = False  # the database held no unfinished batch at the last look, and no line ran here
        while True:
            try:
                now = time.monotonic()
                # idle, the database is looked at again after idle_poll_s or when the service wakes
                # the runner (a batch created here); another server's new batch waits that long here
                if not idle or woken or now - last_finish > self.idle_poll_s:
                    claimed = await self._claim()
                    # batches are checked for their end every poll_s, and at once when the service
                    # woke the runner (a batch created or cancelled) or the last lines running here
                    # have ended; not when interactive requests come and go (a round trip each)
                    if now - last_finish > self.poll_s or woken or (was_running and not claimed and
                                                                    not self._running):
                        # the batches to end now, SWEEP_BATCHES a pass at most: one query, however
                        # many batches wait on lines (of a model no server has, say)
                        for batch_id, expired in await asyncio.to_thread(store.ready, BUILD_LEASE_S,
                                                                         SWEEP_BATCHES):
                            await self.service.finish_if_done(batch_id, expire=expired)
                        last_finish = now
                        idle = not self._running and not await asyncio.to_thread(store.unfinished)
                was_running = bool(self._running)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 (a database hiccup must not end the runner)
                log.exception("batch runner step failed")
            waits = [asyncio.ensure_future(self._wake.wait()), asyncio.ensure_future(self.activity.changed.wait())]
            waits += list(self._running.values())
            try:
                await asyncio.wait(waits, timeout=self.idle_poll_s if idle else self.poll_s,
                                   return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits[:2]:
                    w.cancel()
            woken = self._wake.is_set()
            self._wake.clear()
            self.activity.changed.clear()

    async def _claim(self) -> list[ClaimedLine]:
        """Claim as many lines as may start now (none while interactive requests are in flight or
        left less than ``QUIET_S`` ago) and start them."""
        quiet = self.activity.quiet_for() >= QUIET_S
        free = self.capacity() - len(self._running) if quiet else 0
        if free <= 0:
            return []
        models = None if self.models is None else self.models()
        claimed = await asyncio.to_thread(self.service.batches.claim, self.runner_id, free, self.lease_s, models,
                                          list(self._running))
        if resumed := sum(1 for line in claimed if line.lost):
            log.warning("batch lines run again: %d whose last run ended with nothing recorded (its server stopped, "
                        "its claim not renewed for --batch-lease %gs)", resumed, self.lease_s)
        for line in claimed:
            self._running[line.id] = asyncio.create_task(self._run(line))
        return claimed

    async def _run(self, line: ClaimedLine) -> None:
        store = self.service.batches
        try:
            if line.lost >= MAX_LOST:
                log.error("batch %s line %s: lost %d times, recorded as failed", line.batch_id, line.custom_id,
                          line.lost)
                await asyncio.to_thread(store.complete, line.id, line.owner, 500, lost_error(line))
                return
            url = "/v1/messages" if line.api == "anthropic" else await self._endpoint(line.batch_id)
            status, body = await self.dispatch(line.owner, url, line.request)
            if status in TRANSIENT:
                await asyncio.to_thread(store.retry_later, self.runner_id, line.id, backoff_s)
            else:
                await asyncio.to_thread(store.complete, line.id, line.owner, status, body)
        except StoreFull as exc:  # the line is recorded with the error; its batch ends failed
            try:
                await self.service.stop_full(line.batch_id, str(exc))
            except Exception:  # noqa: BLE001 (its batch goes on; the next line's result stops it)
                log.exception("batch %s: stopping it for a full store failed", line.batch_id)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 (the claim lapses; a line lost MAX_LOST times is failed)
            log.exception("batch %s line %s: its result could not be recorded", line.batch_id, line.custom_id)
        finally:
            self._running.pop(line.id, None)
            self._wake.set()

    async def _endpoint(self, batch_id: str) -> str:
        body = await asyncio.to_thread(self.service.batches.body, batch_id)
        return body["endpoint"] if body else "/v1/chat/completions"

    async def close(self) -> None:
        """Stop: lines running are dropped unrecorded and their claims given up, so the next
        runner (this server restarted, another replica) runs them."""
        ids, tasks = list(self._running), list(self._running.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self.service.batches.release, self.runner_id, ids)
