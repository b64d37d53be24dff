"""The continuous-batching scheduler alone: admission, chunked-prefill budget, KV accounting,
prefix reuse, preemption, both KV layouts (the unified one unless a test says split). No model
involved."""

from __future__ import annotations

import threading

import pytest

from glmserve.engine.admission import AdmissionControl
from glmserve.engine.llama_cpp.kv.scheduler import BACKGROUND_PROMPT_TOKENS, SPLIT_COPY_MIN_TOKENS, Scheduler
from glmserve.engine.llama_cpp.kv.sequence import KVOp, Sequence, SeqStatus


def seq(name: str, tokens) -> Sequence:
    return Sequence(name, list(tokens))


def run_step(s: Scheduler, sampled: int = 7):
    """One step: schedule, then append a token for every chunk that samples."""
    out = s.schedule()
    for chunk in out.chunks:
        if chunk.sample:
            s.append_token(chunk.seq, sampled)
    return out


def test_admission_up_to_max_num_seqs_then_wait():
    s = Scheduler(max_num_seqs=2, n_ctx=100, max_num_batched_tokens=50)
    a, b, c = seq("a", range(5)), seq("b", range(5)), seq("c", range(5))
    for x in (a, b, c):
        s.add(x)
    out = run_step(s)
    assert [ch.seq for ch in out.chunks] == [a, b]
    assert (a.status, b.status, c.status) == (SeqStatus.RUNNING, SeqStatus.RUNNING, SeqStatus.WAITING)
    s.finish(a)
    out = run_step(s)
    assert [ch.seq.request_id for ch in out.chunks] == ["b", "c"]
    assert c.slot == a.slot  # the freed slot is reused


def test_decode_gets_one_token_each_and_prefill_is_chunked():
    s = Scheduler(max_num_seqs=4, n_ctx=1000, max_num_batched_tokens=10)
    short, long = seq("short", range(3)), seq("long", range(100, 125))
    s.add(short)
    run_step(s)  # short: 3-token prefill, samples
    s.add(long)
    out = run_step(s)
    assert [(c.seq.request_id, c.start, c.length, c.sample) for c in out.chunks] == [
        ("short", 3, 1, True), ("long", 0, 9, False)]
    out = run_step(s)
    assert [(c.seq.request_id, c.start, c.length, c.sample) for c in out.chunks] == [
        ("short", 4, 1, True), ("long", 9, 9, False)]
    out = run_step(s)
    assert [(c.seq.request_id, c.start, c.length, c.sample) for c in out.chunks] == [
        ("short", 5, 1, True), ("long", 18, 7, True)]
    assert all(o.num_tokens <= 10 for o in [out])


def test_budget_never_exceeded():
    s = Scheduler(max_num_seqs=8, n_ctx=4000, max_num_batched_tokens=16)
    for i in range(8):
        s.add(seq(f"r{i}", range(i * 50, i * 50 + 30)))
    for _ in range(40):
        out = run_step(s)
        assert out.num_tokens <= 16
    assert all(x.status is SeqStatus.RUNNING for x in s.running)


def test_kv_accounting_and_waiting_for_room():
    s = Scheduler(max_num_seqs=4, n_ctx=20, max_num_batched_tokens=64)
    a = seq("a", range(12))
    b = seq("b", range(100, 110))
    s.add(a)
    s.add(b)
    run_step(s)
    assert s.kv_used == 12 and b.status is SeqStatus.WAITING  # 12 + 10 > 20: b waits
    s.finish(a)
    run_step(s)
    # a's slot is idle with 12 cached cells; they are evicted to make room for b
    assert b.status is SeqStatus.RUNNING
    assert s.kv_used == 10


def test_prefix_reuse_from_an_idle_slot_in_place():
    s = Scheduler(max_num_seqs=2, n_ctx=100, max_num_batched_tokens=64)
    system = list(range(500, 520))
    first = seq("first", system + [1, 2, 3])
    s.add(first)
    run_step(s)
    s.finish(first)
    second = seq("second", system + [9, 9])
    s.add(second)
    out = run_step(s)
    assert second.num_cached == 20 and second.slot == first.slot
    assert out.kv_ops == [KVOp("rm", first.slot, 20)]  # drop what differs, keep the prefix
    assert [(c.start, c.length) for c in out.chunks] == [(20, 2)]


def test_chat_continuation_extends_its_slot_in_place():
    s = Scheduler(max_num_seqs=2, n_ctx=100, max_num_batched_tokens=64)
    turn1 = seq("turn1", range(30))
    s.add(turn1)
    run_step(s)
    run_step(s)  # one generated token decoded: 31 cells
    s.finish(turn1)
    turn2 = seq("turn2", turn1.tokens[:31] + [77, 78])  # history + reply + new user message
    s.add(turn2)
    out = run_step(s)
    assert turn2.slot == turn1.slot and turn2.num_cached == 31 and out.kv_ops == []
    assert [(c.start, c.length) for c in out.chunks] == [(31, 2)]


def test_a_new_prompt_takes_an_empty_slot_before_evicting_a_cache():
    s = Scheduler(max_num_seqs=2, n_ctx=100, max_num_batched_tokens=64)
    first = seq("first", range(10))
    s.add(first)
    run_step(s)
    s.finish(first)
    other = seq("other", range(100, 105))  # nothing in common
    s.add(other)
    out = run_step(s)
    assert other.slot != first.slot and out.kv_ops == []
    assert s.slots[first.slot].n_kv == 10


def test_identical_prompt_recomputes_last_token():
    s = Scheduler(max_num_seqs=1, n_ctx=100, max_num_batched_tokens=64)
    a = seq("a", range(10))
    s.add(a)
    run_step(s)
    s.finish(a)
    b = seq("b", range(10))
    s.add(b)
    out = run_step(s)
    assert b.num_cached == 9
    assert [(c.start, c.length, c.sample) for c in out.chunks] == [(9, 1, True)]


def test_prefix_copied_from_a_running_slot_only_once_decoded():
    s = Scheduler(max_num_seqs=3, n_ctx=200, max_num_batched_tokens=64)
    system = list(range(500, 530))
    a, b = seq("a", system + [1]), seq("b", system + [2])
    s.add(a)
    s.add(b)
    out = run_step(s)
    # a's cells are only written in this very step: b must not copy them yet
    assert b.num_cached == 0 and not [op for op in out.kv_ops if op.kind == "cp"]
    c = seq("c", system + [3])
    s.add(c)
    out = run_step(s)  # a and b are running with the system prompt decoded; c's slot is empty
    assert c.slot == 2 and c.num_cached == 30
    assert KVOp("cp", 2, 0, 30, src=a.slot) in out.kv_ops
    assert [(ch.seq, ch.start, ch.length) for ch in out.chunks][-1] == (c, 30, 1)
    assert s.kv_used == (32 + 32 + 31)  # copied cells are counted again: conservative


def test_no_copy_from_a_slot_reassigned_in_the_same_step():
    """A slot truncated for one new request must not be a copy source, in the same step, for
    cells it does not hold yet (they are decoded in that very batch)."""
    s = Scheduler(max_num_seqs=2, n_ctx=400, max_num_batched_tokens=200)
    shared = list(range(500, 530))
    for name, tail in (("old1", [1] * 50), ("old2", [2] * 50)):
        x = seq(name, shared + tail)
        s.add(x)
        run_step(s)
        s.finish(x)
    # two new requests that share 31 tokens with each other but only 30 with the old caches
    a, b = seq("a", shared + [7, 8, 8]), seq("b", shared + [7, 9, 9])
    s.add(a)
    s.add(b)
    out = run_step(s)
    copies = [op for op in out.kv_ops if op.kind == "cp"]
    assert all(op.p1 <= 30 for op in copies), out.kv_ops
    assert a.num_cached == 30 and b.num_cached == 30


def test_preemption_when_kv_runs_out():
    s = Scheduler(max_num_seqs=2, n_ctx=12, max_num_batched_tokens=64)
    a, b = seq("a", range(5)), seq("b", range(100, 105))
    s.add(a)
    s.add(b)
    run_step(s)  # 10 cells used, both sampled a token
    run_step(s)  # 12 cells: full
    assert s.kv_used == 12
    out = run_step(s)  # a needs a cell: the newest (b) is preempted
    assert out.preempted == [b]
    assert b.status is SeqStatus.WAITING and s.waiting[0] is b and b.num_computed == 0
    assert KVOp("rm", 1, 0) in out.kv_ops
    assert [c.seq for c in out.chunks] == [a]
    assert b.tokens[:5] == list(range(100, 105)) and len(b.tokens) == 7  # keeps what it generated


def test_abort_while_waiting_and_running():
    s = Scheduler(max_num_seqs=1, n_ctx=100, max_num_batched_tokens=64)
    a, b = seq("a", range(5)), seq("b", range(5))
    s.add(a)
    s.add(b)
    run_step(s)
    s.finish(b)  # waiting
    s.finish(a)  # running
    assert not s.has_work() and a.status is b.status is SeqStatus.FINISHED
    assert s.kv_used == 5  # a's slot keeps its 5 decoded cells as a cache (the sampled token has none)
    assert s.slots[0].seq is None


def test_failed_sequence_drops_its_cache():
    s = Scheduler(max_num_seqs=1, n_ctx=100, max_num_batched_tokens=64)
    a = seq("a", range(10))
    s.add(a)
    run_step(s)
    assert s.finish(a, keep_cache=False) == a.slot
    assert s.kv_used == 0 and s.slots[a.slot].tokens == []
    b = seq("b", range(10))
    s.add(b)
    run_step(s)
    assert b.num_cached == 0  # nothing reused from the failed sequence


def test_sequence_too_long_is_refused():
    s = Scheduler(max_num_seqs=1, n_ctx=8, max_num_batched_tokens=64)
    with pytest.raises(ValueError):
        s.add(seq("x", range(9)))


def test_admission_control_is_bounded_and_thread_safe():
    ac = AdmissionControl(max_num_seqs=2, max_queue=3)
    results: list[bool] = []
    threads = [threading.Thread(target=lambda: results.append(ac.try_acquire())) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count(True) == 5 and ac.in_flight == 5
    ac.release()
    assert ac.try_acquire() and not ac.try_acquire()


def test_lora_groups_take_turns_and_each_step_serves_one_group():
    s = Scheduler(max_num_seqs=4, n_ctx=1000, max_num_batched_tokens=50)
    base1, tuned, base2 = seq("base1", range(4)), Sequence("tuned", list(range(4)), group="tuned"), seq("base2", range(9, 13))
    for x in (base1, tuned, base2):
        s.add(x)
    served = []
    for _ in range(6):
        out = run_step(s)
        assert {c.seq.group for c in out.chunks} == {out.group}
        served.append((out.group, sorted(c.seq.request_id for c in out.chunks)))
    # arrival order: base1 first; tuned waits at the head until its turn; base2 after it
    assert served[:4] == [(None, ["base1"]), ("tuned", ["tuned"]), (None, ["base1", "base2"]),
                          ("tuned", ["tuned"])]
    assert [g for g, _ in served[4:]] == [None, "tuned"]


def test_prefix_cache_is_reused_only_within_its_group():
    s = Scheduler(max_num_seqs=2, n_ctx=1000, max_num_batched_tokens=50)
    first = Sequence("first", list(range(20)), group="a")
    s.add(first)
    run_step(s)
    s.finish(first)
    other = Sequence("other", list(range(20)) + [99], group="b")
    s.add(other)
    run_step(s)
    assert other.num_cached == 0  # same tokens, other adapter: recomputed
    same = Sequence("same", list(range(20)) + [98], group="a")
    s.add(same)
    run_step(s)
    assert same.num_cached == 20


def test_prefix_cache_is_reused_only_within_its_cache_salt():
    """Another API key's (another salt's) prompt is not matched against a slot's or the host
    cache's cells, nor waited for while it prefills: its ``num_cached`` is 0."""
    from glmserve.engine.llama_cpp.kv.prompt_cache import HostPromptCache

    s = Scheduler(max_num_seqs=4, n_ctx=1000, max_num_batched_tokens=50)  # a free slot for each
    first = Sequence("first", list(range(20)), salt="key-a")
    s.add(first)
    run_step(s)
    s.finish(first)
    for name, salt, cached in [("b", "key-b", 0), ("none", None, 0), ("a", "key-a", 20)]:
        other = Sequence(name, list(range(20)) + [99], salt=salt)
        s.add(other)
        run_step(s)
        assert other.num_cached == cached, name
        s.finish(other)
    cache = HostPromptCache(1000)
    assert cache.put(tuple(range(10)), None, b"x", salt="key-a")
    assert cache.best(list(range(12)), None, 11, "key-b") == (None, 0)
    assert cache.best(list(range(12)), None, 11, "key-a")[1] == 10
    assert not cache.covers(tuple(range(5)), None, "key-b") and cache.covers(tuple(range(5)), None, "key-a")


# ---- split layout: one stream of n_ctx cells per slot ---------------------------------------


def test_split_every_sequence_has_the_whole_context_and_is_never_preempted():
    s = Scheduler(max_num_seqs=3, n_ctx=12, max_num_batched_tokens=64, kv_layout="split")
    assert s.kv_capacity == 36
    seqs = [seq(f"r{i}", range(i * 100, i * 100 + 10)) for i in range(3)]
    for x in seqs:
        s.add(x)
    for _ in range(3):  # 10 + 2 decoded = 12 cells each: the unified layout would have preempted
        out = run_step(s)
        assert not out.preempted and len(out.chunks) == 3
    assert [x.num_computed for x in seqs] == [12, 12, 12] and s.kv_used == 36
    assert all(x.status is SeqStatus.RUNNING for x in seqs)


def test_split_new_request_takes_the_lowest_free_slot_on_a_tie():
    s = Scheduler(max_num_seqs=4, n_ctx=100, max_num_batched_tokens=64, kv_layout="split")
    xs = [seq(f"r{i}", range(i * 10 + 1, i * 10 + 6)) for i in range(3)]
    for x in xs:
        s.add(x)
    run_step(s)
    s.finish(xs[1])  # slots 0 and 2 run; slot 1 holds an unrelated cache, slot 3 is empty
    new = seq("new", range(500, 505))
    s.add(new)
    run_step(s)
    assert new.slot == 1  # running sequences keep neighbouring slot ids


def test_split_copies_a_long_prefix_as_a_whole_stream_then_trims_it():
    s = Scheduler(max_num_seqs=2, n_ctx=1000, max_num_batched_tokens=500, kv_layout="split")
    system = list(range(1000, 1000 + SPLIT_COPY_MIN_TOKENS + 10))
    a = seq("a", system + [1])
    s.add(a)
    run_step(s)  # a's prompt is decoded; it keeps running
    b = seq("b", system + [2, 3])
    s.add(b)
    out = run_step(s)
    n = len(system)
    assert b.slot == 1 and b.num_cached == n
    assert out.kv_ops == [KVOp("cp", 1, 0, -1, src=a.slot), KVOp("rm", 1, n)]
    assert [(c.seq.request_id, c.start, c.length) for c in out.chunks][-1] == ("b", n, 2)


def test_split_short_prefix_is_recomputed_rather_than_copied():
    s = Scheduler(max_num_seqs=2, n_ctx=1000, max_num_batched_tokens=500, kv_layout="split")
    system = list(range(1000, 1000 + SPLIT_COPY_MIN_TOKENS - 1))
    a = seq("a", system + [1])
    s.add(a)
    run_step(s)
    b = seq("b", system + [2])
    s.add(b)
    out = run_step(s)
    assert b.num_cached == 0 and out.kv_ops == []


def test_split_idle_cache_is_reused_in_place():
    s = Scheduler(max_num_seqs=2, n_ctx=100, max_num_batched_tokens=64, kv_layout="split")
    first = seq("first", range(30))
    s.add(first)
    run_step(s)
    s.finish(first)
    second = seq("second", list(range(20)) + [99])
    s.add(second)
    out = run_step(s)
    assert second.slot == first.slot and second.num_cached == 20
    assert out.kv_ops == [KVOp("rm", first.slot, 20)]


def test_unknown_kv_layout_is_refused():
    with pytest.raises(ValueError, match="kv_layout"):
        Scheduler(max_num_seqs=1, n_ctx=8, max_num_batched_tokens=8, kv_layout="paged")


@pytest.mark.parametrize("layout", ["unified", "split"])
def test_batch_priority_sequences_pause_and_give_up_their_slots(layout):
    """Batch work (priority 1) fills the slots; an interactive request (priority 0) takes the
    newest batch sequence's slot at once and runs alone; the batch goes on once it is done,
    the preempted sequence recomputed from its tokens."""
    now = [0.0]
    s = Scheduler(max_num_seqs=2, n_ctx=100, max_num_batched_tokens=50, kv_layout=layout, priority_hold_s=1.0,
                  clock=lambda: now[0])
    b1, b2 = Sequence("b1", list(range(5)), priority=1), Sequence("b2", list(range(10, 15)), priority=1)
    s.add(b1)
    s.add(b2)
    run_step(s)
    run_step(s)
    assert (b1.num_generated, b2.num_generated) == (2, 2)
    user = Sequence("user", list(range(20, 26)))
    s.add(user)
    out = run_step(s)
    assert [c.seq for c in out.chunks] == [user]  # the batch is paused
    assert out.preempted == [b2] and b2.status is SeqStatus.WAITING and b1.status is SeqStatus.RUNNING
    for _ in range(3):
        assert [c.seq for c in run_step(s).chunks] == [user]
    s.finish(user)
    now[0] += 0.6  # the interactive priority holds the engine for priority_hold_s after it ran
    assert s.held_s() == pytest.approx(0.4) and run_step(s).chunks == []
    now[0] += 0.4
    assert s.held_s() == 0.0
    out = run_step(s)
    assert [c.seq for c in out.chunks] == [b1, b2]  # b2 recomputes its prompt and what it generated
    assert (out.chunks[1].start, out.chunks[1].length) == (0, 7)
    assert b1.num_generated == 3


def test_waiting_queue_is_ordered_by_priority():
    s = Scheduler(max_num_seqs=1, n_ctx=100, max_num_batched_tokens=50)
    batch = [Sequence(f"b{i}", [i + 1], priority=1) for i in range(3)]
    for b in batch:
        s.add(b)
    s.add(user := Sequence("user", [9]))
    assert list(s.waiting) == [user, *batch]
    assert [c.seq for c in run_step(s).chunks] == [user]


def test_lower_priority_work_is_not_admitted_beside_higher_and_holds_end():
    """A batch sequence waits while an interactive one runs, even with a slot free; an
    interactive request that arrives while the batch is held runs at once and renews the hold."""
    now = [0.0]
    s = Scheduler(max_num_seqs=4, n_ctx=100, max_num_batched_tokens=50, priority_hold_s=1.0, clock=lambda: now[0])
    s.add(user := Sequence("user", [1, 2, 3]))
    s.add(batch := Sequence("b", [4, 5, 6], priority=1))
    assert [c.seq for c in run_step(s).chunks] == [user]
    assert batch.status is SeqStatus.WAITING and s.held_s() == 0.0  # not held: waiting behind running work
    s.finish(user)
    now[0] += 0.5
    assert run_step(s).chunks == [] and s.held_s() == pytest.approx(0.5)
    s.add(again := Sequence("again", [7, 8]))  # the agent's next turn
    assert [c.seq for c in run_step(s).chunks] == [again]
    s.finish(again)
    now[0] += 0.9
    assert run_step(s).chunks == []  # held from again's last step
    now[0] += 0.1
    assert [c.seq for c in run_step(s).chunks] == [batch]
    assert s.held_s() == 0.0


def test_a_background_step_computes_few_prompt_tokens_and_every_decode():
    """Steps of background work (priority 1) compute at most BACKGROUND_PROMPT_TOKENS prompt
    tokens, in chunks, while every running background sequence still decodes; interactive
    steps use the whole max_num_batched_tokens."""
    s = Scheduler(max_num_seqs=4, n_ctx=1000, max_num_batched_tokens=512, priority_hold_s=0.0)
    s.add(first := Sequence("b0", list(range(10)), priority=1))
    run_step(s)
    s.add(long := Sequence("b1", list(range(300)), priority=1))
    out = run_step(s)
    assert [(c.seq, c.length) for c in out.chunks] == [(first, 1), (long, BACKGROUND_PROMPT_TOKENS)]
    while long.num_computed < 300:
        lengths = {c.seq.request_id: c.length for c in run_step(s).chunks}
        assert lengths["b0"] == 1 and lengths["b1"] <= BACKGROUND_PROMPT_TOKENS
    s.add(user := Sequence("user", list(range(1000, 1300))))
    assert [(c.seq, c.length) for c in run_step(s).chunks] == [(user, 300)]


def _with_image(name: str, before: int, n_tokens: int, n_pos: int, after: int, pixels: bytes = b"red") -> Sequence:
    """``before`` text tokens, an image (of ``pixels``) of ``n_tokens`` tokens at ``n_pos``
    positions, ``after`` more."""
    from glmserve.engine.llama_cpp.kv.prompt_cache import media_token
    from glmserve.engine.llama_cpp.kv.sequence import MediaSpan

    tokens = [*range(1, before + 1), *[media_token(pixels)] * n_tokens, *range(100, 100 + after)]
    return Sequence(name, tokens, media=(MediaSpan(before, n_tokens, n_pos, None),))


def test_an_image_is_never_cut_between_chunks_and_positions_skip_what_it_saves():
    s = Scheduler(max_num_seqs=2, n_ctx=1000, max_num_batched_tokens=8)
    a, b = _with_image("a", 5, 20, 6, 4), seq("b", range(30))
    s.add(a)
    s.add(b)
    first = run_step(s)
    assert [(c.seq.request_id, c.start, c.length) for c in first.chunks] == [("a", 0, 25)]  # through the image
    second = run_step(s)
    assert [(c.seq.request_id, c.start, c.length, c.sample) for c in second.chunks] == [("a", 25, 4, True),
                                                                                        ("b", 0, 4, False)]
    assert [a.position(i) for i in (0, 4, 25, 28, 29)] == [0, 4, 11, 14, 15]  # 20 tokens at 6 positions
    assert a.whole(0, 3) == 3 and a.whole(0, 6) == 25 and a.whole(25, 2) == 2


def test_a_prefix_is_shared_across_the_same_image_only():
    s = Scheduler(max_num_seqs=1, n_ctx=1000, max_num_batched_tokens=100)
    a = _with_image("a", 5, 20, 6, 4)
    s.add(a)
    run_step(s)
    s.finish(a)
    other = _with_image("other", 5, 20, 6, 4, pixels=b"blue")  # another image in the same place
    s.add(other)
    out = run_step(s)
    assert other.num_cached == 5 and out.chunks[0].start == 5
    assert KVOp("rm", other.slot, 5) in out.kv_ops
    s.finish(other)
    again = _with_image("again", 5, 20, 6, 9, pixels=b"blue")  # the same image, the conversation's next turn
    s.add(again)
    out = run_step(s)
    assert again.num_cached == 29 and out.chunks[0].start == 29 and out.chunks[0].length == 5


def test_a_shared_prefix_never_ends_inside_an_image():
    from glmserve.engine.llama_cpp.kv.prompt_cache import common_prefix, media_token

    red, blue = [media_token(b"red")] * 4, [media_token(b"blue")] * 4
    assert media_token(b"red") < 0 and media_token(b"red") != media_token(b"blue")
    assert common_prefix([1, 2, *red, 3], [1, 2, *red, 3, 4], 99) == 7
    assert common_prefix([1, 2, *red, 3], [1, 2, *red, 5], 99) == 6  # the whole image, then text differs
    assert common_prefix([1, 2, *red, 3], [1, 2, *blue, 3], 99) == 2
    assert common_prefix([1, 2, *red, 3], [1, 2, *red, 3], 4) == 2  # the limit falls inside the image
    assert common_prefix([1, 2, *red, *red, 3], [1, 2, *red, 7], 99) == 2  # adjacent equal images: not split
    assert common_prefix([1, 2, *red], [1, 2, *red, 3], 99) == 2
