"""What the serving benchmarks share: one round of ``glmserve bench`` at each concurrency,
alternating rounds (servers started in turn, or running side by side and interleaved level by
level), medians over the rounds, and the table they print."""

from __future__ import annotations

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


def bench_round(url: str, model: str, label: str, concurrency: list[int], input_len: int, output_len: int,
                seed: int) -> list[Summary]:
    """``glmserve bench`` against ``url`` at each concurrency c: max(8, 4 c) streaming greedy
    requests of ``output_len`` tokens (ignore_eos), prompts of about ``input_len`` tokens drawn
    from ``seed`` (and c, so that no two levels share prompts)."""
    out = []
    for c in concurrency:
        settings = BenchSettings(url=url, model=model, label=label, concurrency=[c], num_requests=max(8, 4 * c),
                                 input_len=input_len, output_len=output_len, ignore_eos=True, seed=seed * 1000 + c)
        out += asyncio.run(run_all(settings))[1]
    return out


def alternate(names: list[str], start: Callable[[str], object], rounds: int, concurrency: list[int],
              input_len: int, output_len: int, model: str,
              after: Callable[[str, object], None] | None = None) -> dict[str, list[list[Summary]]]:
    """``rounds`` rounds; each starts every system in ``names`` in turn (``start(name)`` returns
    a server with ``url`` and ``stop()``; the order rotates every round), runs ``bench_round`` on
    it with the round's prompts, calls ``after(name, server)`` if given, and stops it, so the
    systems never share the machine. Returns {name: [each round's summaries]}."""
    rows: dict[str, list[list[Summary]]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
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
    """``rounds`` rounds of ``bench_round`` over servers already running (``urls``: {label: base
    URL}): each level of ``concurrency`` runs on every server back to back, the order of the
    servers rotated at every level and every round (A B, B A, A B, ... for two), so that one
    level's runs on the servers are minutes apart at most and a drift in the machine's speed
    falls on both. ``watch(label, round, c)``, if given, is called before each run and returns
    a function called with its ``Summary``. Returns {label: [each round's summaries, by level]}."""
    labels = list(urls)
    rows: dict[str, list[list[Summary]]] = {label: [[] for _ in range(rounds)] for label in labels}
    for r in range(rounds):
        for i, c in enumerate(concurrency):
            k = (r + i) % len(labels)
            for label in labels[k:] + labels[:k]:
                done = watch(label, r, c) if watch is not None else None
                summary, = bench_round(urls[label], model, label, [c], input_len, output_len, seed=r)
                rows[label][r].append(summary)
                if done is not None:
                    done(summary)
    return rows


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


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far, all its threads (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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
                except FileNotFoundError:
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


def save(name: str, title: str, report: str, stats: dict, command: str | None = None) -> None:
    """Print ``report`` and keep it in ``results/NAME.md`` (under ``title``, with the command
    that made it: ``command``, default ``python benchmarks/NAME.py``) and ``stats`` in
    ``results/NAME.json``."""
    print(report)
    results = Path(__file__).parent / "results"
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
