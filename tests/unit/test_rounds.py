"""``benchmarks/rounds.py``: ``order`` is ABBA (each system first equally often at every level
over each pair of rounds), ``interleave`` warms every server up at each level before the run
that is measured and watched, ``paired`` compares round with round, odd round counts are
refused, ``cpu_seconds`` reads a nanosecond clock, and ``children_cpu_seconds`` counts a
server's engine process."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from types import SimpleNamespace

import pytest

from tests.benchmark_scripts import load



def _rounds():
    return load("rounds")


def test_order_is_abba_and_balanced_at_every_level():
    rounds = _rounds()
    assert [rounds.order(["a", "b"], r) for r in range(4)] == [["a", "b"], ["b", "a"], ["b", "a"], ["a", "b"]]
    for n_rounds in (2, 4, 6):
        for level in range(3):
            first = Counter(rounds.order(["a", "b"], r, level)[0] for r in range(n_rounds))
            assert first == {"a": n_rounds // 2, "b": n_rounds // 2}, (n_rounds, level)
    three = ["a", "b", "c"]
    for level in range(3):  # three systems: every pair of rounds gives each the same mean position
        for pair in range(3):
            positions = Counter()
            for r in (2 * pair, 2 * pair + 1):
                for i, name in enumerate(rounds.order(three, r, level)):
                    positions[name] += i
            assert set(positions.values()) == {2}
        assert Counter(rounds.order(three, r, level)[0] for r in range(6)) == {"a": 2, "b": 2, "c": 2}


def test_an_odd_number_of_rounds_is_refused():
    rounds = _rounds()
    assert rounds.check_rounds("4") == 4
    for bad in (0, 1, 3):
        with pytest.raises(ValueError, match="even number"):
            rounds.check_rounds(bad)
    with pytest.raises(ValueError, match="even number"):
        rounds.interleave({"a": "a"}, 3, [1], 32, 64, "m")


def test_levels_interleaved_warmed_up_and_in_abba_order(monkeypatch):
    rounds = _rounds()
    runs = []

    def bench_round(url, model, label, concurrency, input_len, output_len, seed, warmup=True):
        assert not warmup  # interleave warms up itself, before the watched run
        runs.append(("run", url, concurrency[0], seed))
        return [SimpleNamespace(url=url, concurrency=concurrency[0], seed=seed)]

    def warm_up(url, model, label, c, input_len, output_len, seed):
        runs.append(("warm-up", url, c, seed))

    monkeypatch.setattr(rounds, "bench_round", bench_round)
    monkeypatch.setattr(rounds, "warm_up", warm_up)
    watched = []

    def watch(label, r, c):
        watched.append(("watch", label, r, c))
        runs.append(watched[-1])
        return lambda summary: watched.append((label, r, c, summary.url))

    rows = rounds.interleave({"a": "http://a", "b": "http://b"}, 4, [1, 32], 32, 64, "m", watch)
    measured = [(url, c, seed) for kind, url, c, seed in runs if kind == "run"]
    assert measured == [("http://a", 1, 0), ("http://b", 1, 0), ("http://b", 32, 0), ("http://a", 32, 0),
                        ("http://b", 1, 1), ("http://a", 1, 1), ("http://a", 32, 1), ("http://b", 32, 1),
                        ("http://b", 1, 2), ("http://a", 1, 2), ("http://a", 32, 2), ("http://b", 32, 2),
                        ("http://a", 1, 3), ("http://b", 1, 3), ("http://b", 32, 3), ("http://a", 32, 3)]
    # each measured run: its warm-up at the same level, then watch, then the run itself
    for i in range(0, len(runs), 3):
        (kind0, url0, c0, r0), (kind1, label, r1, c1), (kind2, url2, c2, r2) = runs[i:i + 3]
        assert (kind0, kind1, kind2) == ("warm-up", "watch", "run")
        assert url0 == url2 == f"http://{label}" and c0 == c1 == c2 and r0 == r1 == r2
    assert [(s.url, s.concurrency, s.seed) for r in rows["a"] for s in r] == \
        [("http://a", c, r) for r in range(4) for c in (1, 32)]
    assert [w for w in watched if w[0] != "watch"] == [
        ("a" if u == "http://a" else "b", seed, c, u) for u, c, seed in measured]


def test_paired_waves_warm_each_level_then_trials_in_abba_order(monkeypatch):
    rounds = _rounds()
    runs = []
    monkeypatch.setattr(rounds, "warm_up", lambda url, model, label, c, i, o, seed: runs.append(("warm-up", url, c)))

    def wave(url, model, label, c, input_len, output_len, seed):
        runs.append(("wave", url, c, seed))
        return SimpleNamespace(url=url, seed=seed)

    monkeypatch.setattr(rounds, "wave", wave)
    waves = rounds.paired_waves({"a": "http://a", "b": "http://b"}, [1, 8], 4, 32, 64, "m")
    assert runs[:2] == [("warm-up", "http://a", 1), ("warm-up", "http://b", 1)]
    assert [r[1][-1] for r in runs[2:10]] == list("abbabaab")  # ABBA over the trials
    assert [r[3] for r in runs[2:10]] == [1000, 1000, 1001, 1001, 1002, 1002, 1003, 1003]  # the same prompts
    assert runs[10:12] == [("warm-up", "http://a", 8), ("warm-up", "http://b", 8)]
    assert [w.seed for w in waves["b"][8]] == [8000, 8001, 8002, 8003]
    with pytest.raises(ValueError):
        rounds.paired_waves({"a": "http://a"}, [1], 3, 32, 64, "m")


def test_paired_trials_quartiles_stay_within_the_trials():
    """The exclusive method gave 0.898 .. 2.175 for trials 1.111 and 1.962."""
    p = _rounds().paired_trials([1.111, 1.962], [1.0, 1.0])
    assert p["min"] <= p["q1"] <= p["median"] <= p["q3"] <= p["max"]
    assert (p["q1"], p["q3"]) == (pytest.approx(1.111 + 0.851 / 4), pytest.approx(1.111 + 3 * 0.851 / 4))


def test_alternate_starts_the_systems_in_abba_order(monkeypatch):
    rounds = _rounds()
    started = []
    monkeypatch.setattr(rounds, "bench_round", lambda url, *a, seed: [SimpleNamespace(url=url, seed=seed)])

    def start(name):
        started.append(name)
        return SimpleNamespace(url=name, stop=lambda: None)

    rows = rounds.alternate(["a", "b"], start, 4, [1], 32, 64, "m")
    assert started == ["a", "b", "b", "a", "b", "a", "a", "b"]
    assert [s.seed for r in rows["b"] for s in r] == [0, 1, 2, 3]


def test_paired_is_the_median_of_per_round_ratios():
    """Issue 78's example: per-round ratios 0.962, 1.001, 1.012 (and a fourth); a ratio of each
    system's own median would say otherwise."""
    rounds = _rounds()
    ours = [R(96.2), R(100.1), R(101.2), R(99.0)]
    theirs = [R(100.0), R(100.0), R(100.0), R(100.0)]
    p = rounds.paired(rounds.per_round(ours, 1), rounds.per_round(theirs, 1))
    assert p["rounds"] == [0.962, 1.001, 1.012, 0.99]
    assert (p["min"], p["max"]) == (pytest.approx(0.962), pytest.approx(1.012))
    assert p["median"] == pytest.approx((0.99 + 1.001) / 2)
    assert "0.962 .. 1.012" in rounds.paired_text(p)
    # where the rounds disagree, the pairing is what counts: each round 10% faster, yet the
    # medians of the two systems' rounds are equal
    ours, theirs = [R(110), R(55), R(110), R(55)], [R(100), R(50), R(100), R(50)]
    assert rounds.paired(rounds.per_round(ours, 1), rounds.per_round(theirs, 1))["median"] == pytest.approx(1.1)
    with pytest.raises(ValueError):
        rounds.paired([1.0, 2.0], [1.0])


def R(tok_s: float) -> list:  # noqa: N802 (one round's summaries)
    return [SimpleNamespace(concurrency=1, output_throughput=tok_s)]


def test_cpu_seconds_resolves_a_few_milliseconds():
    """A child that spends 3 ms of CPU (its own clock) between two reads is measured as at least
    3 ms each time, and as 3-9 ms at best of five (a busy machine adds its own time to some
    reads): ``/proc``'s 10 ms ticks would read 0 or 10."""
    rounds = _rounds()
    burn = ("import sys, time\nfor line in sys.stdin:\n    t = time.process_time()\n"
            "    while time.process_time() - t < 0.003: pass\n    print('done', flush=True)")
    child = subprocess.Popen([sys.executable, "-c", burn], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        child.stdin.write("warm\n")
        child.stdin.flush()
        assert child.stdout.readline() == "done\n"
        spent = []
        for _ in range(5):
            before = rounds.cpu_seconds(child.pid)
            child.stdin.write("go\n")
            child.stdin.flush()
            assert child.stdout.readline() == "done\n"
            spent.append(rounds.cpu_seconds(child.pid) - before)
        assert min(spent) >= 0.003 and min(spent) < 0.009, spent
    finally:
        child.stdin.close()
        child.wait(timeout=60)
    with pytest.raises(ProcessLookupError):
        rounds.cpu_seconds(child.pid)


def test_children_cpu_seconds_counts_grandchildren():
    """A process two levels below ``child`` that spent 0.3 s of CPU (its own clock) is counted
    under ``child``, whose own time is not. Rooted at ``child``, not at this process: in the
    suite, this process has other children (the shared servers)."""
    rounds = _rounds()
    burn = "import sys, time\nwhile time.process_time() < 0.3: pass\nprint('done', flush=True)\nsys.stdin.read()"
    middle = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {burn!r}])"
    child = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys; subprocess.run([sys.executable, '-c', "
                              f"{middle!r}])"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "done\n"
        assert 0.25 <= rounds.children_cpu_seconds(child.pid) < 1.0
    finally:
        child.stdin.close()
        child.wait(timeout=60)
