"""How the batch services reach the state database: ``call`` runs a store's method in a
worker thread (``bulk``: on a bulk worker at a lower CPU priority, for seconds of parsing or
writing, a key's jobs bounded), with a stateless server's 404 and a full store's 400
(``store_full``); ``not_found``, OpenAI's 404 for an id it does not have."""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import os
import threading
from typing import Any

from glmserve.protocol.errors import APIError, invalid_request, overloaded
from glmserve.state import StoreFull

COMPLETION_WINDOW_S = 24 * 3600
BULK_NICE = 10  # the bulk workers' niceness: below the engine's threads on a busy CPU


def _lower_priority() -> None:
    """A bulk worker's start: this thread runs at ``BULK_NICE`` (Linux sets a thread's own
    niceness; elsewhere the call fails and nothing changes)."""
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BULK_NICE)


# uploads read and checked, batch files parsed, output files written: seconds of CPU for a big
# file, in threads that give way to the engine's (a stream's next token) on a busy machine
_BULK = concurrent.futures.ThreadPoolExecutor(2, "glmserve-bulk", initializer=_lower_priority)


BULK_PER_KEY = 2  # a key's bulk jobs (uploads, batch files parsed) queued or running at once
BULK_RETRY_AFTER_S = 1
_bulk_held: collections.Counter[str] = collections.Counter()  # by owner (the event loop's thread only)


async def bulk(fn, *args, owner: str | None = None):
    """``fn(*args)`` on a bulk worker (``_BULK``), awaited. ``owner``: a client's job, at most
    ``BULK_PER_KEY`` of that key's at once (past that a 429 with ``Retry-After``), so one key's
    uploads never queue ahead of every other key's on the two workers; None: the server's own
    work (a batch's output files)."""
    if owner is not None:
        if _bulk_held[owner] >= BULK_PER_KEY:
            raise overloaded(f"this API key has {BULK_PER_KEY} uploads or batch files being processed; "
                             "retry when one has finished", BULK_RETRY_AFTER_S)
        _bulk_held[owner] += 1
    try:
        return await asyncio.get_running_loop().run_in_executor(_BULK, fn, *args)
    finally:
        if owner is not None:
            _bulk_held[owner] -= 1
            if not _bulk_held[owner]:
                del _bulk_held[owner]


def require(store: Any) -> None:
    """Raises the 404 of a stateless server (``store`` None: files and batches are not kept)."""
    if store is None:
        raise APIError(404, "files and batches are not stored on this server", "invalid_request_error", None, None)


async def call(store: Any, method: str, *args: Any, bulk_work: bool = False, owner: str | None = None) -> Any:
    """``store.method(*args)`` in a worker thread (``bulk_work``: a bulk worker, ``owner``'s as
    ``bulk`` bounds it); a 404 on a stateless server (``store`` None, ``require``), a 400
    ``store_full`` for ``StoreFull``."""
    require(store)
    try:
        if bulk_work:
            return await bulk(getattr(store, method), *args, owner=owner)
        return await asyncio.to_thread(getattr(store, method), *args)
    except StoreFull as exc:
        raise invalid_request(str(exc), None, "store_full") from None


def not_found(kind: str, object_id: str) -> APIError:
    """404, OpenAI's answer for a ``kind`` (file, batch) id it does not have (or not for this key)."""
    return APIError(404, f"No {kind} found with id '{object_id}'.", "invalid_request_error", None, None)
