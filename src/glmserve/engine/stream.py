"""Hand outputs from an engine's worker thread to the asyncio consumer of ``generate``.

Engine-neutral: every engine's worker thread calls ``OutputStream.put`` (thread-safe) and the
event loop awaits ``OutputStream.get``.
"""

from __future__ import annotations

import asyncio

from glmserve.engine.types import GenerationOutput


class OutputStream:
    """A one-consumer queue bound to the event loop that created it."""

    __slots__ = ("_loop", "_queue")

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[GenerationOutput] = asyncio.Queue()

    def put(self, output: GenerationOutput) -> None:
        """Called from any thread. Silently dropped if the loop is closed (server exiting)."""
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, output)
        except RuntimeError:
            pass

    async def get(self) -> GenerationOutput:
        return await self._queue.get()
