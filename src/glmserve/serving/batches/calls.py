"""How the batch services reach the state database: ``call`` runs a store's method in a
worker thread (``bulk``: on a bulk worker at a lower CPU priority, for seconds of parsing or
writing), with a stateless server's 404 and a full store's 400 (``store_full``); ``not_found``,
OpenAI's 404 for an id it does not have."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import threading
from typing import Any

from glmserve.protocol.errors import APIError, invalid_request
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


async def bulk(fn, *args):
    """``fn(*args)`` on a bulk worker (``_BULK``), awaited."""
    return await asyncio.get_running_loop().run_in_executor(_BULK, fn, *args)


def require(store: Any) -> None:
    """Raises the 404 of a stateless server (``store`` None: files and batches are not kept)."""
    if store is None:
        raise APIError(404, "files and batches are not stored on this server", "invalid_request_error", None, None)


async def call(store: Any, method: str, *args: Any, bulk_work: bool = False) -> Any:
    """``store.method(*args)`` in a worker thread (``bulk_work``: a bulk worker); a 404 on a
    stateless server (``store`` None, ``require``), a 400 ``store_full`` for ``StoreFull``."""
    require(store)
    try:
        if bulk_work:
            return await bulk(getattr(store, method), *args)
        return await asyncio.to_thread(getattr(store, method), *args)
    except StoreFull as exc:
        raise invalid_request(str(exc), None, "store_full") from None


def not_found(kind: str, object_id: str) -> APIError:
    """404, OpenAI's answer for a ``kind`` (file, batch) id it does not have (or not for this key)."""
    return APIError(404, f"No {kind} found with id '{object_id}'.", "invalid_request_error", None, None)
