"""Ray Serve replicas: one replica vs two (one thread each), and the Ray proxy's overhead
against the plain server, in alternating rounds of one run; prints medians over the rounds.

Systems (the default model on llama_cpp, ``--n-threads 1`` everywhere):

- ``single``: ``glmserve serve`` (one process, uvicorn);
- ``ray x1``: ``glmserve serve --replicas 1`` (a local Ray instance, Ray Serve's proxy);
- ``ray x2``: ``glmserve serve --replicas 2``.

Each round starts each system in turn (the order rotates every round), runs ``glmserve bench``
(streaming, greedy, ignore_eos, fixed output length) at each concurrency with fresh prompts,
and stops it: two local Ray instances cannot share the machine, so the systems never overlap.

    python benchmarks/replicas.py --rounds 4 --concurrency 1,4
"""

from __future__ import annotations

import argparse

from glmserve.bench.report import hardware
from glmserve.testing import DEFAULT_MODEL, RemoteServer
from rounds import alternate, check_rounds, medians, save, table  # benchmarks/rounds.py

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4])
    ap.add_argument("--max-num-seqs", type=int, default=4)
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--rounds", type=check_rounds, default=4, help="an even number (ABBA order)")
    args = ap.parse_args()
    rows = alternate(list(SYSTEMS), lambda name: start(name, args), args.rounds, args.concurrency,
                     args.input_len, args.output_len, DEFAULT_MODEL)
    stats = {name: {c: medians(rounds, c) for c in args.concurrency} for name, rounds in rows.items()}
    lines = table(stats, args.concurrency)
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
    save("replicas", "Ray Serve replicas vs one server", report, stats)

if __name__ == "__main__":
    main()
