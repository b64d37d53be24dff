"""Race a handler against the client's disconnect (vLLM ``entrypoints/utils.py``
``with_cancellation``): when the client goes away, the handler task is cancelled, which
closes the engine stream and aborts the engine request."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from fastapi import Request

T = TypeVar("T")


async def _wait_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def with_cancellation(handler: Awaitable[T], request: Request) -> T | None:
    """The handler's result, or None when the client disconnected first (handler cancelled)."""
    task = asyncio.ensure_future(handler)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if task in done:
        return task.result()
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    return None
