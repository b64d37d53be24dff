"""Several async iterators read concurrently, as one (the choices of ``n`` and of a list of
prompts)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import TypeVar

T = TypeVar("T")
_DONE = object()


async def merged(sources: list[AsyncIterator[T]]) -> AsyncIterator[tuple[int, T]]:
    """``(i, item)`` for every item of ``sources[i]``, in the order they come. An exception in
    one source is raised here once the others are stopped. However this generator ends, every
    source is closed (an engine stream closed early aborts its request)."""
    if len(sources) == 1:  # the usual case: no task and queue hop per item
        async with aclosing(sources[0]) as items:
            async for item in items:
                yield 0, item
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(index: int, source: AsyncIterator[T]) -> None:
        try:
            async with aclosing(source) as items:
                async for item in items:
                    await queue.put((index, item))
        except Exception as exc:  # handed to the reader
            await queue.put((index, exc))
        finally:
            await queue.put((index, _DONE))

    tasks = [asyncio.create_task(pump(i, source)) for i, source in enumerate(sources)]
    try:
        remaining = len(tasks)
        while remaining:
            index, item = await queue.get()
            if item is _DONE:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
