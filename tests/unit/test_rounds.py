"""``benchmarks/rounds.py``: ``interleave`` runs every level on every server back to back, the
servers' order rotated at every level and every round, each run's summary going to its server's
round and to ``watch``; ``children_cpu_seconds`` counts a server's engine process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

BENCHMARKS = Path(__file__).parent.parent.parent / "benchmarks"


def _rounds():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import rounds
    finally:
        sys.path.remove(str(BENCHMARKS))
    return rounds


def test_levels_interleaved_and_order_rotated(monkeypatch):
    rounds = _rounds()
    runs = []

    def bench_round(url, model, label, concurrency, input_len, output_len, seed):
        runs.append((url, concurrency, seed))
        return [SimpleNamespace(url=url, concurrency=concurrency[0], seed=seed)]

    monkeypatch.setattr(rounds, "bench_round", bench_round)
    watched = []

    def watch(label, r, c):
        return lambda summary: watched.append((label, r, c, summary.url))

    rows = rounds.interleave({"a": "http://a", "b": "http://b"}, 2, [1, 32, 64], 32, 64, "m", watch)
    assert runs == [("http://a", [1], 0), ("http://b", [1], 0), ("http://b", [32], 0), ("http://a", [32], 0),
                    ("http://a", [64], 0), ("http://b", [64], 0),
                    ("http://b", [1], 1), ("http://a", [1], 1), ("http://a", [32], 1), ("http://b", [32], 1),
                    ("http://b", [64], 1), ("http://a", [64], 1)]
    assert [(s.url, s.concurrency, s.seed) for r in rows["a"] for s in r] == \
        [("http://a", c, r) for r in (0, 1) for c in (1, 32, 64)]
    assert [len(r) for r in rows["b"]] == [3, 3]
    assert watched == [("a" if u == "http://a" else "b", seed, c[0], u) for u, c, seed in runs]


def test_three_servers_rotate(monkeypatch):
    rounds = _rounds()
    order = []
    monkeypatch.setattr(rounds, "bench_round", lambda url, *a, seed: order.append(url) or [SimpleNamespace()])
    rounds.interleave({"a": "a", "b": "b", "c": "c"}, 1, [1, 2, 3], 32, 64, "m")
    assert order == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]


def test_children_cpu_seconds_counts_grandchildren():
    """A process two levels below ``child`` that spent 0.3 s of CPU (its own clock; /proc counts
    10 ms ticks) is counted under ``child``, whose own time is not. Rooted at ``child``, not at
    this process: in the suite, this process has other children (the shared servers)."""
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
