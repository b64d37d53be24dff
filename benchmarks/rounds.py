"""What the serving benchmarks share: one round of ``glmserve bench`` at each concurrency,
rounds in a balanced order (servers started in turn, or running side by side and interleaved
level by level), a discarded warm-up at each level's concurrency, medians over the rounds,
comparisons as the median of per-round (paired) ratios, CPU time from a nanosecond clock, and the
table they print. How and why: docs/engineering/measuring.md."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from glmserve.bench.metrics import Summary
from glmserve.bench.runner import run_all
from glmserve.settings.bench import BenchSettings

TABLE_HEAD = ["| concurrency | system | output tok/s (median) | per round | TTFT p50 ms | TPOT p50 ms | failed |",
              "|---:|---|---:|---|---:|---:|---:|"]


WARMUP_SEED = 10**6  # warm-up prompts are drawn from seeds past any measured run's


class UnbalancedRounds(argparse.ArgumentTypeError, ValueError):
    """An odd number of rounds (argparse prints its message as the argument's error)."""


def check_rounds(rounds: int | str) -> int:
    """``rounds`` if it is even and positive (``order`` balances pairs of rounds); else
    ``UnbalancedRounds``, a ``ValueError`` (benchmarks use it as an argparse ``type``)."""
    rounds = int(rounds)
    if rounds < 2 or rounds % 2:
        raise UnbalancedRounds(f"an even number of rounds (2, 4, ...) is needed for a balanced order, not {rounds}")
    return rounds


def order(labels: list[str], r: int, i: int = 0) -> list[str]:
    """The order in which the systems ``labels`` run in round ``r`` at level ``i``: ABBA over the
    rounds (round 2k runs a rotation of ``labels``, round 2k+1 the same rotation reversed), the
    rotation advanced every pair of rounds and every level. So over each pair of rounds every
    system's mean position is the same, and with two systems each goes first once per pair at
    every level: a system that gains from going first (a warmer cache, a quieter spell) gains
    equally often."""
    k = (r // 2 + i) % len(labels)
    rotated = labels[k:] + labels[:k]
    return rotated[::-1] if r % 2 else rotated


def bench_round(url: str, model: str, label: str, concurrency: list[int], input_len: int, output_len: int,
                seed: int, warmup: bool = True) -> list[Summary]:
    """``glmserve bench`` against ``url`` at each concurrency c: max(8, 4 c) streaming greedy
    requests of ``output_len`` tokens (ignore_eos), prompts of about ``input_len`` tokens drawn
    from ``seed`` (and c, so that no two levels share prompts); with ``warmup``, first one wave
    of c requests at concurrency c on prompts of their own, discarded (the server's batch shapes,
    buffers and caches for that level, made before anything is measured)."""
    out = []
    for c in concurrency:
        if warmup:
            warm_up(url, model, label, c, input_len, output_len, seed)
        settings = BenchSettings(url=url, model=model, label=label, concurrency=[c], num_requests=max(8, 4 * c),
                                 input_len=input_len, output_len=output_len, ignore_eos=True, seed=seed * 1000 + c)
        out += asyncio.run(run_all(settings))[1]
    return out


def warm_up(url: str, model: str, label: str, c: int, input_len: int, output_len: int, seed: int) -> None:
    """One wave of ``c`` requests at concurrency ``c`` (as ``bench_round``'s, on prompts of
    their own), its figures discarded."""
    wave(url, model, label, c, input_len, output_len, WARMUP_SEED + seed * 1000 + c)


def wave(url: str, model: str, label: str, c: int, input_len: int, output_len: int, seed: int) -> Summary:
    """One wave of ``c`` streaming greedy requests (ignore_eos) at concurrency ``c``, prompts of
    about ``input_len`` tokens drawn from ``seed``: its ``glmserve bench`` summary."""
    settings = BenchSettings(url=url, model=model, label=label, concurrency=[c], num_requests=c, input_len=input_len,
                             output_len=output_len, ignore_eos=True, seed=seed)
    return asyncio.run(run_all(settings))[1][0]


def alternate(names: list[str], start: Callable[[str], object], rounds: int, concurrency: list[int],
              input_len: int, output_len: int, model: str,
              after: Callable[[str, object], None] | None = None) -> dict[str, list[list[Summary]]]:
    """``rounds`` rounds (even: ``check_rounds``); each starts every system in ``names`` in turn
    (``start(name)`` returns a server with ``url`` and ``stop()``; in ``order``: ABBA), runs
    ``bench_round`` on it with the round's prompts (each level warmed up first), calls
    ``after(name, server)`` if given, and stops it, so the systems never share the machine.
    Returns {name: [each round's summaries]}."""
    check_rounds(rounds)
    rows: dict[str, list[list[Summary]]] = {name: [] for name in names}
    for r in range(rounds):
        for name in order(names, r):
            server = start(name)
            try:
                rows[name].append(bench_round(server.url, model, name, concurrency, input_len, output_len, seed=r))
                if after is not None:
                    after(name, server)
            finally:
                server.stop()
    return rows


def interleave(urls: dict[str, str], rounds: int, concurrency: list[int], input_len: int, output_len: int,
               model: str, watch: Callable[[str, int, int], Callable[[Summary], None]] | None = None,
               ) -> dict[str, list[list[Summary]]]:
    """``rounds`` rounds (even: ``check_rounds``) of ``bench_round`` over servers already running
    (``urls``: {label: base URL}): each level of ``concurrency`` runs on every server back to
    back (each warmed up at that level first, the warm-up not measured), in ``order`` (ABBA over
    the rounds, shifted by level), so that one level's runs on the servers are minutes apart at
    most, a drift in the machine's speed falls on both, and each server goes first equally often.
    ``watch(label, round, c)``, if given, is called before each measured run (after its warm-up)
    and returns a function called with its ``Summary``. Returns {label: [each round's summaries,
    by level]}."""
    check_rounds(rounds)
    labels = list(urls)
    rows: dict[str, list[list[Summary]]] = {label: [[] for _ in range(rounds)] for label in labels}
    for r in range(rounds):
        for i, c in enumerate(concurrency):
            for label in order(labels, r, i):
                warm_up(urls[label], model, label, c, input_len, output_len, seed=r)
                done = watch(label, r, c) if watch is not None else None
                summary, = bench_round(urls[label], model, label, [c], input_len, output_len, seed=r, warmup=False)
                rows[label][r].append(summary)
                if done is not None:
                    done(summary)
    return rows


def paired_waves(urls: dict[str, str], concurrency: list[int], trials: int, input_len: int, output_len: int,
                 model: str) -> dict[str, dict[int, list[Summary]]]:
    """Trials over servers running side by side (``urls``: {label: base URL}), each idle but for
    the wave it is sent: per level of ``concurrency`` a discarded wave on each, then ``trials``
    (even: ``check_rounds``) trials of one ``wave`` of c requests on each (the same prompts), in
    ``order`` (ABBA over the trials), so that a trial's measurements are seconds apart. Returns
    {label: {c: each trial's summary}}."""
    check_rounds(trials)
    labels = list(urls)
    waves: dict[str, dict[int, list[Summary]]] = {label: {c: [] for c in concurrency} for label in labels}
    for c in concurrency:
        for label in labels:
            warm_up(urls[label], model, label, c, input_len, output_len, seed=0)
        for t in range(trials):
            for label in order(labels, t):
                waves[label][c].append(wave(urls[label], model, label, c, input_len, output_len, seed=1000 * c + t))
    return waves


def wave_medians(waves: list[Summary]) -> dict:
    """Medians over ``paired_waves``' trials of one system at one level: output tok/s, TTFT,
    TPOT and ITL p50 (ms); failed requests summed."""
    return {"output_tok_s": statistics.median(w.output_throughput for w in waves),
            "ttft_p50_ms": statistics.median(w.ttft_ms["p50"] for w in waves),
            "tpot_p50_ms": statistics.median(w.tpot_ms["p50"] for w in waves),
            "itl_p50_ms": statistics.median(w.itl_ms["p50"] for w in waves), "failed": sum(w.failed for w in waves)}


def paired_trials(ours: list[float], theirs: list[float]) -> dict:
    """``paired`` with the quartiles of the ratios (``q1``, ``q3``; the inclusive method, within
    the trials' range), for ``paired_waves``' trials."""
    ratio = paired(ours, theirs)
    q1, _, q3 = statistics.quantiles(ratio["rounds"], n=4, method="inclusive")
    return {**ratio, "q1": q1, "q3": q3}


def medians(rounds: list[list[Summary]], c: int) -> dict:
    """Medians over the rounds at concurrency ``c``: output tok/s, TTFT and TPOT p50 (ms);
    failed requests summed; each round's tok/s."""
    at = [s for summaries in rounds for s in summaries if s.concurrency == c]
    return {"output_tok_s": statistics.median(s.output_throughput for s in at),
            "ttft_p50_ms": statistics.median(s.ttft_ms["p50"] for s in at),
            "tpot_p50_ms": statistics.median(s.tpot_ms["p50"] for s in at),
            "failed": sum(s.failed for s in at),
            "rounds": [round(s.output_throughput, 1) for s in at]}


def table(stats: dict[str, dict[int, dict]], concurrency: list[int]) -> list[str]:
    """Markdown rows of ``stats`` ({system: {c: medians}}), by concurrency, then system."""
    lines = list(TABLE_HEAD)
    for c in concurrency:
        for label, by_c in stats.items():
            m = by_c[c]
            lines.append(f"| {c} | {label} | {m['output_tok_s']:.1f} | {m['rounds']} | {m['ttft_p50_ms']:.0f} | "
                         f"{m['tpot_p50_ms']:.1f} | {m['failed']} |")
    return lines


def per_round(rounds: list[list[Summary]], c: int, metric: Callable[[Summary], float] | None = None) -> list[float]:
    """``metric`` (default: output tok/s) of each round's summary at concurrency ``c``, in round
    order."""
    metric = metric or (lambda s: s.output_throughput)
    return [metric(s) for summaries in rounds for s in summaries if s.concurrency == c]


def paired(ours: list[float], theirs: list[float]) -> dict:
    """The comparison of two systems measured in the same rounds: the ratio ``ours[r] /
    theirs[r]`` of each round (the two runs of a round are minutes apart, so a slow spell of the
    machine falls on both), and their median, minimum and maximum. Raises ``ValueError`` when
    the lists differ in length."""
    if len(ours) != len(theirs) or not ours:
        raise ValueError(f"paired rounds needed: {len(ours)} against {len(theirs)}")
    ratios = [a / b for a, b in zip(ours, theirs)]
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
            "rounds": [round(x, 3) for x in ratios]}


def paired_text(p: dict) -> str:
    """``paired``'s figures in one phrase: ``1.001 (rounds 0.962 .. 1.012: [0.962, 1.001, ...])``."""
    return f"{p['median']:.3f} (rounds {p['min']:.3f} .. {p['max']:.3f}: {p['rounds']})"


def _cpu_clock(pid: int) -> int:
    """Linux's CPU-time clock of process ``pid`` (glibc's ``clock_getcpuclockid``: the pid's
    bits inverted, shifted left by 3, or'ed with CPUCLOCK_SCHED = 2)."""
    return ((~pid) << 3) | 2


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far, all its threads, ended ones too: the
    kernel's per-process CPU-time clock (the scheduler's runtime in nanoseconds, not ``/proc``'s
    10 ms ticks; ``CPU_CLOCK`` says what that gives per token). Raises ``ProcessLookupError``
    when the process is gone."""
    try:
        return time.clock_gettime(_cpu_clock(pid))
    except OSError:
        raise ProcessLookupError(pid) from None


# what the figures from cpu_seconds can resolve; a running thread's time is brought up to date at
# the scheduler's tick, so a read made while the server works may miss up to a tick of each busy
# thread: the benchmarks read between runs, when the server is idle
CPU_CLOCK = (f"CPU time from the kernel's per-process CPU clock (resolution "
             f"{time.clock_getres(_cpu_clock(os.getpid())) * 1e9:.0f} ns), read between runs")


def children_cpu_seconds(pid: int) -> float:
    """``cpu_seconds`` summed over the live descendants of process ``pid`` (vLLM's engine core
    under an API server), from ``/proc/PID/task/TID/children``."""
    total, stack = 0.0, [pid]
    while stack:
        parent = stack.pop()
        try:
            tasks = list(Path(f"/proc/{parent}/task").iterdir())
        except FileNotFoundError:  # it ended meanwhile
            continue
        for task in tasks:
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except FileNotFoundError:
                continue
            for kid in kids:
                try:
                    total += cpu_seconds(kid)
                except ProcessLookupError:
                    continue
                stack.append(kid)
    return total


def memory_mib(pid: int | str = "self") -> tuple[float, float]:
    """(VmRSS, RssAnon) of process ``pid`` (default: this one) in MiB, from Linux's
    ``/proc/PID/status``; RssAnon is heap and engine buffers, without mapped model files."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon"):
            fields[key] = int(value.split()[0]) / 1024
    return fields["VmRSS"], fields["RssAnon"]


def save(name: str, title: str, report: str, stats: dict, command: str | None = None,
         folder: Path | None = None) -> None:
    """Print ``report`` and keep it in ``results/NAME.md`` (under ``title``, with the command
    that made it: ``command``, default ``python benchmarks/NAME.py``) and ``stats`` in
    ``results/NAME.json`` (``folder`` instead of ``results/`` where given)."""
    print(report)
    results = folder or Path(__file__).parent / "results"
    results.mkdir(exist_ok=True)
    command = command or f"python benchmarks/{name}.py"
    (results / f"{name}.md").write_text(f"# {title}\n\n`{command}`\n\n{report}\n")
    (results / f"{name}.json").write_text(json.dumps(stats, indent=2))


async def stream_chat(client: httpx.AsyncClient, body: dict) -> dict:
    """POST ``body`` (a streamed chat completion) to ``client``'s ``/v1/chat/completions``;
    returns its ``text``, the ``start``, ``first`` (first content delta, None if none) and ``end``
    times (``time.perf_counter``), the last ``usage`` seen and llama-server's ``timings``."""
    start, first, text, usage, timings = time.perf_counter(), None, [], {}, {}
    async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        if resp.status_code >= 400:
            raise RuntimeError(f"{resp.status_code} from {resp.url}: {(await resp.aread()).decode()[:500]}")
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or []:
                delta = (choice.get("delta") or {}).get("content")
                if delta:
                    first = first or time.perf_counter()
                    text.append(delta)
            usage = chunk.get("usage") or usage
            timings = chunk.get("timings") or timings
    return {"text": "".join(text), "start": start, "first": first, "end": time.perf_counter(), "usage": usage,
            "timings": timings}
