"""Ray Serve replicas: one replica vs two (one thread each), and the Ray proxy's overhead
against the plain server, in alternating rounds of one run; prints medians over the rounds.

Systems (the default model on llama_cpp, ``--n-threads 1`` everywhere):

- ``single``: ``glmserve serve`` (one process, uvicorn);
- ``ray x1``: ``glmserve serve --replicas 1`` (a local Ray instance, Ray Serve's proxy);
- ``ray x2``: ``glmserve serve --replicas 2``.

Each round starts each system in turn (the order rotates every round), runs ``glmserve bench``
(streaming, greedy, ignore_eos, fixed output length) at each concurrency with fresh prompts,
and stops it: two local Ray instances cannot share the machine, so the systems never overlap.

    python benchmarks/replicas.py --rounds 3 --concurrency 1,4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
from pathlib import Path

from glmserve.bench.metrics import Summary
from glmserve.bench.report import hardware
from glmserve.bench.runner import run_all
from glmserve.settings import BenchSettings
from glmserve.testing import DEFAULT_MODEL, RemoteServer

RESULTS = Path(__file__).parent / "results"
SYSTEMS = {
    "single": (),
    "ray x1": ("--replicas", "1", "--replica-cpus", "1"),
    "ray x2": ("--replicas", "2", "--replica-cpus", "1"),
}


def start(name: str, args) -> RemoteServer:
    flags = SYSTEMS[name]
    srv = RemoteServer(*flags, "--max-num-seqs", str(args.max_num_seqs), "--max-queue", "1024", n_threads=1,
                       startup_timeout=600)
    if flags:
        srv.wait_for_replicas(int(flags[1]), 600)
    return srv


def run_round(url: str, label: str, args, seed: int) -> list[Summary]:
    out = []
    for c in args.concurrency:
        settings = BenchSettings(url=url, model=DEFAULT_MODEL, label=label, concurrency=[c],
                                 num_requests=max(8, 4 * c), input_len=args.input_len, output_len=args.output_len,
                                 ignore_eos=True, seed=seed * 1000 + c)
        out += asyncio.run(run_all(settings))[1]
    return out


def medians(rounds: list[list[Summary]], c: int) -> dict:
    at = [s for summaries in rounds for s in summaries if s.concurrency == c]
    return {"output_tok_s": statistics.median(s.output_throughput for s in at),
            "ttft_p50_ms": statistics.median(s.ttft_ms["p50"] for s in at),
            "tpot_p50_ms": statistics.median(s.tpot_ms["p50"] for s in at),
            "failed": sum(s.failed for s in at),
            "rounds": [round(s.output_throughput, 1) for s in at]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4])
    ap.add_argument("--max-num-seqs", type=int, default=4)
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    rows: dict[str, list[list[Summary]]] = {name: [] for name in SYSTEMS}
    names = list(SYSTEMS)
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            srv = start(name, args)
            try:
                rows[name].append(run_round(srv.url, name, args, seed=r))
            finally:
                srv.stop()
    stats = {name: {c: medians(rounds, c) for c in args.concurrency} for name, rounds in rows.items()}
    lines = ["| concurrency | system | output tok/s (median) | per round | TTFT p50 ms | TPOT p50 ms | failed |",
             "|---:|---|---:|---|---:|---:|---:|"]
    for c in args.concurrency:
        for name in SYSTEMS:
            m = stats[name][c]
            lines.append(f"| {c} | {name} | {m['output_tok_s']:.1f} | {m['rounds']} | {m['ttft_p50_ms']:.0f} | "
                         f"{m['tpot_p50_ms']:.1f} | {m['failed']} |")
    ratios = []
    for c in args.concurrency:
        one, two, single = stats["ray x1"][c], stats["ray x2"][c], stats["single"][c]
        ratios.append(f"- c={c}: throughput ray x2 / ray x1 {two['output_tok_s'] / one['output_tok_s']:.2f}; "
                      f"ray x1 / single {one['output_tok_s'] / single['output_tok_s']:.2f}, TTFT p50 ray x1 - single "
                      f"{one['ttft_p50_ms'] - single['ttft_p50_ms']:+.0f} ms")
    report = "\n".join([
        f"hardware: {hardware()} | model: {DEFAULT_MODEL} (llama_cpp, 1 thread per replica) | max_num_seqs "
        f"{args.max_num_seqs} per replica | input ~{args.input_len} tokens, output {args.output_len} (ignore_eos, "
        f"greedy) | requests per level: max(8, 4 x concurrency) | {args.rounds} alternating rounds, medians",
        "", *lines, "", *ratios])
    print(report)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "replicas.md").write_text(
        "# Ray Serve replicas vs one server\n\n`python benchmarks/replicas.py`\n\n" + report + "\n")
    (RESULTS / "replicas.json").write_text(json.dumps(stats, indent=2))


if __name__ == "__main__":
    main()
