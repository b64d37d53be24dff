"""``engine/stream.py``: outputs handed from an engine thread to the consumer, one event-loop
wake-up per step, in order, each one as the engine gave it."""

from __future__ import annotations

import asyncio
import threading

from glmserve.engine.stream import OutputBatch, OutputStream, RequestStream
from glmserve.engine.types import GenerationOutput, TokenLogprob


def _out(i: int, finish=None, logprobs: bool = False) -> GenerationOutput:
    return GenerationOutput("r", [i], f"t{i} ", finish, num_prompt_tokens=7, num_cached_tokens=3 if i else 0,
                            logprobs=[TokenLogprob(i, -0.5)] if logprobs else None)


def test_a_consumer_that_keeps_up_gets_every_output_alone():
    async def run():
        stream = OutputStream()
        got = []
        for i in range(3):
            stream.put_nowait(_out(i, "length" if i == 2 else None))
            got.append(await stream.get())
        return got

    assert [(o.token_ids, o.text) for o in asyncio.run(run())] == [([0], "t0 "), ([1], "t1 "), ([2], "t2 ")]


def test_outputs_queued_while_the_consumer_was_away_come_one_by_one():
    """Not merged: usage counts the tokens up to a stop string, output by output."""
    async def run():
        stream = OutputStream()
        for i in range(3):
            stream.put_nowait(_out(i, logprobs=True))
        return [await stream.get() for _ in range(3)]

    assert [out.token_ids for out in asyncio.run(run())] == [[0], [1], [2]]


def test_a_step_from_an_engine_thread_reaches_the_request_stream_in_order():
    async def run():
        outputs = OutputStream()
        stream = RequestStream("r", outputs, lambda rid: None)

        def engine_thread():
            for i in range(50):
                batch = OutputBatch()
                batch.add(outputs, _out(i, "length" if i == 49 else None))
                batch.flush()

        thread = threading.Thread(target=engine_thread)
        thread.start()
        got = [out async for out in stream]
        thread.join()
        return got

    got = asyncio.run(run())
    assert [out.token_ids for out in got] == [[i] for i in range(50)] and got[-1].finish_reason == "length"


def test_closing_a_stream_before_its_last_output_aborts_the_request():
    aborted = []

    async def run():
        stream = RequestStream("r", OutputStream(), aborted.append)
        await stream.aclose()

    asyncio.run(run())
    assert aborted == ["r"]


def test_a_cancelled_wait_leaves_the_stream_usable():
    """A consumer cancelled while it waits (an abort) leaves no stale waiter behind: a later
    output goes to the next ``get``."""
    async def run():
        stream = OutputStream()
        waiting = asyncio.create_task(stream.get())
        await asyncio.sleep(0)
        waiting.cancel()
        assert (await asyncio.gather(waiting, return_exceptions=True))[0].__class__ is asyncio.CancelledError
        stream.put_nowait(_out(5, "stop"))
        later = asyncio.create_task(stream.get())
        stream.put_nowait(_out(6))  # queued behind
        return await later, await stream.get()

    first, second = asyncio.run(run())
    assert (first.token_ids, second.token_ids) == ([5], [6])
