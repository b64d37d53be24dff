"""``engine/stream.py``: outputs handed from an engine thread to the consumer, one event-loop
wake-up per step, in order; a request's outputs between two hand-overs merged into one, held
for later steps' within ``--stream-interval-ms`` but for a request's first and last."""

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


async def _handed(stream: OutputStream) -> list[GenerationOutput]:
    """What the batch handed to ``stream`` so far (its ``call_soon_threadsafe`` callbacks run)."""
    await asyncio.sleep(0)
    got = []
    while stream._items:
        got.append(await stream.get())
    return got


def test_outputs_of_one_step_for_one_request_are_merged():
    async def run():
        stream, other = OutputStream(), OutputStream()
        batch = OutputBatch()
        batch.add(stream, _out(1, logprobs=True))
        batch.add(other, _out(9))
        batch.add(stream, _out(2, logprobs=True))
        batch.add(stream, _out(3, "stop", logprobs=True))
        batch.add(stream, _out(4))  # after the last: never read
        batch.step_done(0.0)
        return await _handed(stream), await _handed(other)

    (merged,), (alone,) = asyncio.run(run())
    assert (merged.token_ids, merged.text, merged.finish_reason) == ([1, 2, 3], "t1 t2 t3 ", "stop")
    assert [lp.token_id for lp in merged.logprobs] == [1, 2, 3] and merged.num_cached_tokens == 3
    assert alone.token_ids == [9]


def test_without_an_interval_every_step_is_handed_over():
    async def run():
        stream, batch, got = OutputStream(), OutputBatch(), []
        for i in range(3):
            batch.add(stream, _out(i))
            batch.step_done(0.0)
            got.append([o.token_ids for o in await _handed(stream)])
        return got

    assert asyncio.run(run()) == [[[0]], [[1]], [[2]]]


def test_within_the_interval_only_the_first_and_last_outputs_go_at_once():
    async def run():
        stream, batch, got = OutputStream(), OutputBatch(interval_s=60), []
        for i in range(5):
            batch.add(stream, _out(i, "length" if i == 4 else None))
            batch.step_done(0.01)
            got.append([o.token_ids for o in await _handed(stream)])
        return got

    assert asyncio.run(run()) == [[[0]], [], [], [], [[1, 2, 3, 4]]]


def test_an_output_held_as_long_as_the_interval_goes():
    """The next step is taken to last as long as the last one: held only if it ends in time."""
    async def run():
        stream, batch, got = OutputStream(), OutputBatch(interval_s=0.05), []
        batch.add(stream, _out(0))
        batch.step_done(0.0)
        assert [o.token_ids for o in await _handed(stream)] == [[0]]  # a first output goes at once
        for i, step_s in ((1, 0.01), (2, 0.06)):
            batch.add(stream, _out(i))
            batch.step_done(step_s)
            got.append([o.token_ids for o in await _handed(stream)])
        batch.add(stream, _out(3))
        batch.step_done(0.0)
        got.append([o.token_ids for o in await _handed(stream)])
        batch.flush()  # the worker's, before it waits for work
        got.append([o.token_ids for o in await _handed(stream)])
        return got

    assert asyncio.run(run()) == [[], [[1, 2]], [], [[3]]]


def test_a_token_by_token_request_is_never_merged_nor_held():
    """A request whose reply ends at stop strings: usage counts the tokens up to the output the
    stop string ended in, so its outputs stay one per token, and hand the step over at once."""
    async def run():
        stream, other = OutputStream(merge=False), OutputStream()
        batch, got = OutputBatch(interval_s=60), []
        batch.add(other, _out(0))
        batch.add(stream, _out(0))
        batch.step_done(0.0)
        await _handed(other)
        for i in (1, 2):
            batch.add(other, _out(i))
            batch.add(stream, _out(i))
            batch.add(stream, _out(i + 10))
            batch.step_done(0.0)
            got.append(([o.token_ids for o in await _handed(stream)], [o.token_ids for o in await _handed(other)]))
        return got

    assert asyncio.run(run()) == [([[0], [1], [11]], [[1]]), ([[2], [12]], [[2]])]
