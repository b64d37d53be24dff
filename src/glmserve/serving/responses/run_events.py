"""A background response run's event log (``serving/responses/stored.py``): the events so far,
kept in memory for streams that join late (``GET /v1/responses/{id}?stream=true&starting_after=N``),
and ``Follow``, one such stream."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from glmserve.protocol.responses import ResponseEvent


@dataclass
class Run:
    """A background run: its task, the events so far (for streams that join late), and who
    waits for the next one."""

    owner: str
    events: list[ResponseEvent] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task | None = None
    finished_at: float | None = None

    def record(self, event: ResponseEvent) -> None:
        """Add ``event`` and wake the streams that wait for it."""
        self.events.append(event)
        self.changed.set()
        self.changed = asyncio.Event()


class Follow:
    """The events of a background run after ``after``, then each new one until it ends.
    Closing it leaves the run going."""

    def __init__(self, run: Run, after: int) -> None:
        self._run, self._next = run, max(0, after + 1)  # a run's events are numbered by their index

    def __aiter__(self) -> Follow:
        return self

    async def __anext__(self) -> ResponseEvent:
        run = self._run
        while True:
            if self._next < len(run.events):
                self._next += 1
                return run.events[self._next - 1]
            if run.finished_at is not None:
                raise StopAsyncIteration
            await run.changed.wait()

    async def aclose(self) -> None:
        return None
