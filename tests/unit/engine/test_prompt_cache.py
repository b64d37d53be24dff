"""The host prompt cache alone (bound, LRU, prefixes superseded) and the scheduler's use of it:
save before a slot's cells are reclaimed, load when a saved state gives a longer prefix than any
slot; and one long shared prefix computed once by requests that arrive together. No model
involved (the engine's side: tests/e2e/test_prompt_cache.py)."""

from __future__ import annotations

import pytest

from glmserve.engine.llama_cpp.kv.prompt_cache import HostPromptCache
from glmserve.engine.llama_cpp.kv.scheduler import (
    HOST_RESTORE_MIN_TOKENS, HOST_SAVE_MIN_TOKENS, SPLIT_COPY_MIN_TOKENS, Scheduler,
)
from glmserve.engine.llama_cpp.kv.sequence import KVOp, Sequence


def run_step(s: Scheduler, cache: HostPromptCache | None = None):
    """One step as the engine runs it: schedule, apply saves (a blob of 1 byte a token), then
    append a token for every chunk that samples."""
    out = s.schedule()
    for op in out.kv_ops:
        if op.kind == "save":
            cache.put(op.tokens, op.group, bytearray(len(op.tokens)))
    for chunk in out.chunks:
        if chunk.sample:
            s.append_token(chunk.seq, 7)
    return out


def test_best_match_covers_and_group():
    cache = HostPromptCache(10_000)
    cache.put(range(100), None, bytearray(100))
    cache.put(range(50, 150), "tuned", bytearray(100))
    entry, n = cache.best(list(range(80)) + [1, 2], None, limit=1000)
    assert entry.tokens == tuple(range(100)) and n == 80
    assert cache.best(range(80), None, limit=10)[1] == 10
    assert cache.best(range(50, 150), None, limit=1000) == (None, 0)  # the base model has no such entry
    assert cache.best(range(50, 150), "tuned", limit=1000)[1] == 100
    assert cache.covers(range(60), None) and not cache.covers(range(101), None)
    assert not cache.covers(range(60), "tuned")


def test_bound_lru_and_superseded_prefixes():
    cache = HostPromptCache(300)
    cache.put(range(100), None, bytearray(100))
    cache.put(range(1000, 1100), None, bytearray(100))
    cache.put(range(200), None, bytearray(200))  # extends the first: it replaces it
    assert [len(e.tokens) for e in cache.entries] == [100, 200] and cache.stats() == (300, 2, 0)
    cache.touch(cache.entries[0])  # the 1000.. entry is used: the 200-token one is now the oldest
    cache.put(range(2000, 2100), None, bytearray(100))
    assert [e.tokens[0] for e in cache.entries] == [1000, 2000] and cache.nbytes <= 300
    assert not cache.put(range(5000, 5400), None, bytearray(400))  # larger than the whole cache
    assert cache.nbytes <= cache.capacity
    cache.drop_group(None)
    assert cache.entries == [] and cache.nbytes == 0
    with pytest.raises(ValueError):
        HostPromptCache(0)


def test_a_reclaimed_slot_is_saved_and_a_later_prompt_restores_it():
    cache = HostPromptCache(1 << 20)
    s = Scheduler(max_num_seqs=1, n_ctx=4000, max_num_batched_tokens=1000, kv_layout="split", host_cache=cache)
    doc = list(range(1000, 1000 + HOST_SAVE_MIN_TOKENS + 100))
    a = Sequence("a", doc + [1])
    s.add(a)
    run_step(s, cache)
    s.finish(a)
    b = Sequence("b", list(range(5000, 5020)))  # shares nothing: a's cells are reclaimed
    s.add(b)
    out = run_step(s, cache)
    n = len(doc) + 1
    assert out.kv_ops == [KVOp("save", 0, p1=n, tokens=tuple(doc + [1]), group=None), KVOp("rm", 0, 0)]
    s.finish(b)
    again = Sequence("again", doc + [2, 3])  # a's prompt but its last token
    s.add(again)
    out = run_step(s, cache)
    entry = cache.entries[0]
    assert entry.tokens == tuple(doc + [1])
    assert out.kv_ops == [KVOp("load", 0, entry=entry), KVOp("rm", 0, len(doc))]
    assert again.num_cached == len(doc) and cache.stats() == (len(doc) + 1, 1, 1)
    assert [(c.start, c.length) for c in out.chunks] == [(len(doc), 2)]


def test_no_save_for_a_short_loss_and_no_restore_for_a_small_gain():
    cache = HostPromptCache(1 << 20)
    s = Scheduler(max_num_seqs=1, n_ctx=4000, max_num_batched_tokens=1000, kv_layout="split", host_cache=cache)
    doc = list(range(1000, 1000 + 2 * HOST_SAVE_MIN_TOKENS))
    a = Sequence("a", doc + [1] * (HOST_SAVE_MIN_TOKENS - 1))
    s.add(a)
    run_step(s, cache)
    s.finish(a)
    b = Sequence("b", doc + [2])  # reuses doc in place: a's last HOST_SAVE_MIN_TOKENS cells go
    s.add(b)
    assert not [op for op in run_step(s, cache).kv_ops if op.kind == "save"]
    s.finish(b)
    c = Sequence("c", list(range(9000, 9010)))
    s.add(c)
    run_step(s, cache)  # b's cells (doc + [2] + a token) are saved
    s.finish(c)
    assert len(cache.entries) == 1
    d = Sequence("d", list(range(9000, 9010)) + [5, 6])  # the slot holds c: the entry gains nothing
    s.add(d)
    assert not [op for op in run_step(s, cache).kv_ops if op.kind == "load"]
    assert d.num_cached == 10
    assert HOST_RESTORE_MIN_TOKENS <= HOST_SAVE_MIN_TOKENS


def test_host_cache_needs_the_split_layout():
    with pytest.raises(ValueError, match="split"):
        Scheduler(max_num_seqs=1, n_ctx=100, max_num_batched_tokens=10, kv_layout="unified",
                  host_cache=HostPromptCache(100))


def test_requests_sharing_a_long_prefix_compute_it_once():
    """Four sessions with one system prompt arrive together: the first prefills it, the others
    wait for it and then copy it (split layout: one whole-stream copy each)."""
    s = Scheduler(max_num_seqs=4, n_ctx=4000, max_num_batched_tokens=100, kv_layout="split")
    # the first session's last prompt chunk (82 tokens) leaves room for the others in its step,
    # while 80 of the system prompt's tokens are not computed yet: they wait one step
    system = list(range(1000, 1000 + 380))
    sessions = [Sequence(f"s{i}", system + [i, i]) for i in range(4)]
    for x in sessions:
        s.add(x)
    prefilled = 0
    for _ in range(20):
        out = run_step(s)
        prefilled += sum(c.length for c in out.chunks if c.start < len(system))
        if all(x.num_computed >= len(system) for x in sessions):
            break
    assert [x.num_cached for x in sessions] == [0, len(system), len(system), len(system)]
    # the system prompt's cells were computed once (plus what the first session's last chunk held
    # beyond it, and the others' first chunks, which start past it)
    assert prefilled <= len(system) + 2


def test_a_short_shared_prefix_does_not_hold_requests_back():
    s = Scheduler(max_num_seqs=2, n_ctx=4000, max_num_batched_tokens=40, kv_layout="split")
    system = list(range(1000, 1000 + SPLIT_COPY_MIN_TOKENS - 1))
    a, b = Sequence("a", system + [1]), Sequence("b", system + [2])
    s.add(a)
    s.add(b)
    run_step(s)
    out = run_step(s)
    assert b in [c.seq for c in out.chunks]  # admitted while a still prefills
