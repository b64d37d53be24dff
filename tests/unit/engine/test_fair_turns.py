"""Fair turns among tenants (``engine/admission.py``): each key's share of the admission places,
and the order in which waiting requests take free slots (``in_turn``, the llama_cpp scheduler's
queue)."""

from __future__ import annotations

import pytest

from glmserve.engine.admission import AdmissionControl, in_turn
from glmserve.engine.base import EngineOverloaded
from glmserve.engine.llama_cpp.kv.scheduler import Scheduler
from glmserve.engine.llama_cpp.kv.sequence import Sequence, SeqStatus


def take(ac: AdmissionControl, tenant: str | None, n: int) -> int:
    """How many of ``n`` places ``tenant`` gets."""
    return sum(ac.try_acquire(tenant) for _ in range(n))


def test_a_key_alone_holds_half_the_places_and_each_new_key_finds_some():
    ac = AdmissionControl(max_num_seqs=2, max_queue=14)  # 16 places
    assert take(ac, "a", 20) == 8  # alone: 16 // 2
    with pytest.raises(EngineOverloaded, match="holds its share"):
        ac.acquire("a")
    assert take(ac, "b", 20) == 5  # beside a: 16 // 3
    assert take(ac, "c", 20) == 3  # beside a and b: 16 // 4 = 4, but only 3 places are left
    with pytest.raises(EngineOverloaded, match="at capacity"):
        ac.acquire("d")
    assert ac.in_flight == 16
    for _ in range(8):
        ac.release("a")
    assert take(ac, "a", 20) == 4  # back beside b and c: 16 // 4
    assert take(ac, "d", 20) == 3  # beside a, b and c: 16 // 5


def test_a_share_is_never_below_the_running_slots_and_requests_without_a_tenant_take_any_place():
    ac = AdmissionControl(max_num_seqs=4, max_queue=4)  # 8 places
    assert take(ac, "a", 1) == take(ac, "b", 1) == take(ac, "c", 1) == 1
    assert take(ac, "d", 8) == 4  # 8 // 5 is 1: the floor is max_num_seqs, capacity bounds the rest
    ac2 = AdmissionControl(max_num_seqs=2, max_queue=6)
    assert take(ac2, None, 20) == 8  # a server of one key or none: the whole capacity
    for _ in range(8):
        ac2.release(None)
    assert take(ac2, "a", 20) == 4 and ac2.in_flight == 4
    for _ in range(4):
        ac2.release("a")
    assert take(ac2, "b", 20) == 4  # a's places were all given back: b is alone


def test_in_turn_takes_tenants_round_robin_fewest_running_first():
    tenant = lambda item: item[0]  # noqa: E731
    waiting = ["a3", "a4", "a5", "b1", "b2", "c1"]
    assert in_turn(waiting, ["a1", "a2"], tenant) == ["b1", "c1", "b2", "a3", "a4", "a5"]
    assert in_turn(["a1", "a2", "a3"], ["b1"], tenant) is None  # one tenant waits: as it is
    assert in_turn([], [], tenant) is None
    ranked = in_turn(["a1", "b1", "b2"], [], tenant, rank=lambda item: 1 if item == "b1" else 0)
    assert ranked == ["a1", "b2", "b1"]  # rank (priority) first


def seq(name: str, tenant: str | None, priority: int = 0) -> Sequence:
    """A sequence of its own prompt (no cached prefix is shared with another)."""
    return Sequence(name, [ord(c) for c in name] + [0], tenant=tenant, priority=priority)


def test_another_key_s_request_takes_the_next_free_slot_ahead_of_a_key_s_own_queue():
    s = Scheduler(max_num_seqs=2, n_ctx=64, max_num_batched_tokens=64)
    a = [seq(f"a{i}", "A") for i in range(16)]
    for x in a:
        s.add(x)
    s.schedule()
    b = seq("b", "B")
    s.add(b)
    s.finish(a[0])
    out = s.schedule()
    assert [c.seq.request_id for c in out.chunks if c.start == 0] == ["b"]  # first in, first out: a2
    assert b.status is SeqStatus.RUNNING and a[2].status is SeqStatus.WAITING


def test_one_tenant_keeps_arrival_order_and_priority_outranks_turns():
    s = Scheduler(max_num_seqs=1, n_ctx=64, max_num_batched_tokens=64)
    first, second, third = seq("first", None), seq("second", None), seq("third", None)
    for x in (first, second, third):
        s.add(x)
    s.schedule()
    s.finish(first)
    assert [c.seq for c in s.schedule().chunks] == [second]
    batch_b, a = seq("b-batch", "B", priority=1), seq("a-late", "A")
    s.add(batch_b)
    s.add(a)
    s.finish(second)
    assert [c.seq for c in s.schedule().chunks if c.start == 0] == [third]  # None: a tenant as any other
    s.finish(third)
    assert [c.seq for c in s.schedule().chunks if c.start == 0] == [a]  # B has fewer, but a lower priority
