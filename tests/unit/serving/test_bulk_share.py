"""A key's bulk jobs (uploads, batch files parsed: ``serving/batches/calls.py``): at most
``BULK_PER_KEY`` at once, so one key's never queue ahead of every other key's."""

from __future__ import annotations

import asyncio
import threading

import pytest

from glmserve.protocol.errors import APIError
from glmserve.serving.batches.calls import BULK_PER_KEY, bulk


def test_a_key_past_its_bulk_jobs_is_a_429_while_other_keys_and_the_server_get_in():
    release = threading.Event()

    def job(name: str) -> str:
        assert release.wait(30)
        return name

    async def main() -> None:
        held = [asyncio.ensure_future(bulk(job, f"a{i}", owner="a")) for i in range(BULK_PER_KEY)]
        await asyncio.sleep(0)
        with pytest.raises(APIError) as refused:
            await bulk(job, "a-more", owner="a")
        assert refused.value.status_code == 429 and refused.value.headers["Retry-After"] == "1"
        others = [asyncio.ensure_future(bulk(job, "b", owner="b")), asyncio.ensure_future(bulk(job, "server"))]
        await asyncio.sleep(0)
        release.set()
        assert await asyncio.gather(*held, *others) == [*(f"a{i}" for i in range(BULK_PER_KEY)), "b", "server"]
        assert await bulk(job, "a-again", owner="a") == "a-again"  # its places were given back

    asyncio.run(main())
