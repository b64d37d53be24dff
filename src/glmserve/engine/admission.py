"""Admission control, the same for every engine: a bounded count of unfinished requests, so a
request past ``max_num_seqs + max_queue`` is refused at once (the server's 429) and the queue
never grows without bound."""

from __future__ import annotations

import threading

from glmserve.engine.base import EngineOverloaded

QUEUE_PER_SEQ = 8  # waiting requests per running sequence when --max-queue is not set


def queue_limit(max_num_seqs: int, max_queue: int | None) -> int:
    """``max_queue``, or ``QUEUE_PER_SEQ x max_num_seqs`` when it is None: the admission limit
    scales with the batch."""
    return QUEUE_PER_SEQ * max_num_seqs if max_queue is None else max_queue


class AdmissionControl:
    """Thread-safe count of unfinished requests, bounded by ``max_num_seqs + max_queue``
    (``max_queue`` None: see ``queue_limit``): the requests past that are refused at once (the
    server answers 429), so the queue never grows without bound."""

    def __init__(self, max_num_seqs: int, max_queue: int | None) -> None:
        self.max_num_seqs, self.max_queue = max_num_seqs, queue_limit(max_num_seqs, max_queue)
        self.capacity = max_num_seqs + self.max_queue
        self._count = 0
        self._lock = threading.Lock()

    def acquire(self) -> None:
        """Take a place, or raise ``EngineOverloaded`` (the server's 429) when none is free."""
        if not self.try_acquire():
            raise EngineOverloaded(f"server is at capacity ({self.max_num_seqs} running, {self.max_queue} "
                                   "waiting); retry shortly")

    def try_acquire(self) -> bool:
        with self._lock:
            if self._count >= self.capacity:
                return False
            self._count += 1
            return True

    def release(self) -> None:
        with self._lock:
            self._count -= 1

    @property
    def in_flight(self) -> int:
        return self._count

    def split(self) -> tuple[int, int]:
        """(running, waiting): the unfinished requests, the first ``max_num_seqs`` counted as
        running (every engine runs a request as soon as a sequence is free)."""
        count = self._count
        return min(count, self.max_num_seqs), max(0, count - self.max_num_seqs)
