"""Admission control, the same for every engine: a bounded count of unfinished requests, so a
request past ``max_num_seqs + max_queue`` is refused at once (the server's 429) and the queue
never grows without bound; and fair turns among tenants (``GenerationRequest.tenant``: the API
key on a server of several keys).

Fair turns (issue 91, "a key waits behind its own requests first"):

- Places: a tenant holds at most ``capacity // (k + 2)`` of the ``max_num_seqs + max_queue``
  places, where ``k`` is the number of other tenants holding places (never fewer than
  ``max_num_seqs``, so one key alone can still fill every running slot). A key alone thus leaves
  at least half the places free for the next key; requests without a tenant (a server of one key
  or none) count against the total only.
- Slots: when a slot frees, the waiting requests take it round robin across tenants, the tenant
  with the fewest running first (``in_turn``): a key's k-th waiting request with r running is at
  turn ``r + k``, so a key that sends 16 requests at once waits behind its own, and another key's
  one request takes the next free slot. The llama_cpp and transformers engines order their
  queues so; vLLM runs its own scheduler (``--scheduling-policy``), with these places.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TypeVar

from glmserve.engine.base import EngineOverloaded

QUEUE_PER_SEQ = 8  # waiting requests per running sequence when --max-queue is not set

T = TypeVar("T")


def queue_limit(max_num_seqs: int, max_queue: int | None) -> int:
    """``max_queue``, or ``QUEUE_PER_SEQ x max_num_seqs`` when it is None: the admission limit
    scales with the batch."""
    return QUEUE_PER_SEQ * max_num_seqs if max_queue is None else max_queue


class AdmissionControl:
    """Thread-safe count of unfinished requests, bounded by ``max_num_seqs + max_queue``
    (``max_queue`` None: see ``queue_limit``): the requests past that are refused at once (the
    server answers 429), so the queue never grows without bound; a tenant's past its share
    (module docstring) are refused the same way."""

    def __init__(self, max_num_seqs: int, max_queue: int | None) -> None:
        self.max_num_seqs, self.max_queue = max_num_seqs, queue_limit(max_num_seqs, max_queue)
        self.capacity = max_num_seqs + self.max_queue
        self._count = 0
        self._held: Counter[str] = Counter()  # places held, by tenant
        self._lock = threading.Lock()

    def acquire(self, tenant: str | None = None) -> None:
        """Take a place for ``tenant``, or raise ``EngineOverloaded`` (the server's 429) when none
        is free or the tenant holds its share."""
        if not self.try_acquire(tenant):
            if tenant is not None and self._count < self.capacity:
                raise EngineOverloaded(f"this API key holds its share of the server's places ({self._held[tenant]} of "
                                       f"{self.capacity}; the rest are kept for other keys); retry shortly")
            raise EngineOverloaded(f"server is at capacity ({self.max_num_seqs} running, {self.max_queue} "
                                   "waiting); retry shortly")

    def try_acquire(self, tenant: str | None = None) -> bool:
        with self._lock:
            if self._count >= self.capacity or (tenant is not None and self._held[tenant] >= self._share(tenant)):
                return False
            self._count += 1
            if tenant is not None:
                self._held[tenant] += 1
            return True

    def _share(self, tenant: str) -> int:
        others = len(self._held) - (tenant in self._held)
        return max(self.max_num_seqs, self.capacity // (others + 2))

    def release(self, tenant: str | None = None) -> None:
        """Give back a place ``acquire(tenant)`` took."""
        with self._lock:
            self._count -= 1
            if tenant is not None:
                self._held[tenant] -= 1
                if self._held[tenant] <= 0:
                    del self._held[tenant]

    @property
    def in_flight(self) -> int:
        return self._count

    def split(self) -> tuple[int, int]:
        """(running, waiting): the unfinished requests, the first ``max_num_seqs`` counted as
        running (every engine runs a request as soon as a sequence is free)."""
        count = self._count
        return min(count, self.max_num_seqs), max(0, count - self.max_num_seqs)


def in_turn(waiting: Sequence[T], running: Sequence[T], tenant: Callable[[T], str | None],
            rank: Callable[[T], int] = lambda item: 0) -> list[T] | None:
    """The order in which ``waiting`` takes free slots when several tenants wait (module
    docstring): by ``rank`` (the engine's priority, lower first), then by turn, a tenant's k-th
    waiting request with r of its own ``running`` at turn ``r + k`` (ties: the queue's order, so
    each tenant's requests keep theirs). None, at the cost of one pass, when fewer than two
    tenants wait: the order stays as it is."""
    first = tenant(waiting[0]) if waiting else None
    if all(tenant(item) == first for item in waiting):
        return None
    turns = Counter(tenant(item) for item in running)
    keyed = []
    for index, item in enumerate(waiting):
        who = tenant(item)
        keyed.append((rank(item), turns[who], index, item))
        turns[who] += 1
    return [item for *_, item in sorted(keyed, key=lambda k: k[:3])]
