"""What reaches an engine's worker thread from other threads: new requests and aborts.

Engine-neutral: ``Inbox`` carries new requests (and the shutdown signal) to the worker, which
drains it between steps; ``AbortSet`` collects request ids to stop at the next step.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Inbox(Generic[T]):
    """A thread-safe queue of new items, closed by ``close()`` (the worker's signal to stop)."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[T | None] = queue.SimpleQueue()

    def put(self, item: T) -> None:
        self._queue.put(item)

    def close(self) -> None:
        self._queue.put(None)

    def drain(self, wait_s: float | None, take: Callable[[T], None]) -> bool:
        """Hand every queued item to ``take``, waiting up to ``wait_s`` seconds for the first
        (None: until one comes; 0: not at all); False once ``close()`` was called."""
        try:
            item = self._queue.get(block=wait_s != 0, timeout=wait_s)
            while True:
                if item is None:
                    return False
                take(item)
                item = self._queue.get_nowait()
        except queue.Empty:
            return True


class AbortSet:
    """Request ids to abort, added from any thread and taken by the worker once per step."""

    def __init__(self) -> None:
        self._ids: set[str] = set()
        self._lock = threading.Lock()

    def add(self, request_id: str) -> None:
        with self._lock:
            self._ids.add(request_id)

    def take(self) -> set[str]:
        with self._lock:
            ids, self._ids = self._ids, set()
        return ids
