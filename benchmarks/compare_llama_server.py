"""glmserve vs llama.cpp's C++ ``llama-server`` under the same load, in balanced rounds of one
run; prints medians over the rounds, and glmserve against llama-server as the median of per-round
ratios with their range (docs/engineering/measuring.md).

Systems (the embedded default GGUF, the same threads, 8 parallel sequences):
- ``glmserve``: ``glmserve serve`` as shipped: ``--kv-layout auto``, which is split at this size
  (a KV stream of ``--n-ctx``, 4096, cells per sequence: 720 MiB), so every request may use the
  whole 4096-token context;
- ``glmserve --kv-layout unified``: 4096 cells shared by the 8 sequences;
- ``llama-server -np 8``: ``-c 8192`` split in 8 slots of 1024 cells (its default layout), so a
  request may use at most 1024 tokens.

Each round starts each system in turn (ABBA order over an even number of rounds:
``rounds.order``), runs ``glmserve bench`` (streaming, greedy, ignore_eos, fixed output length) at
each concurrency with fresh prompts, each level after a discarded wave at its concurrency, reads
the server's resident memory, and stops it, so the systems never share the CPU.

Build llama-server from the llama-cpp-python source package with the same CMake flags:

    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 && tar xzf llama_cpp_python-*.tar.gz
    cmake -S llama_cpp_python-*/vendor/llama.cpp -B build -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \\
        -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
    cmake --build build --target llama-server -j2

    python benchmarks/compare_llama_server.py --llama-server build/bin/llama-server [--rounds 4]

``--paired TRIALS`` measures glmserve against llama-server more finely: both run at once (each
idle but for the wave it is sent), and each trial sends one wave of c requests (the same
prompts) to each in turn, ABBA from trial to trial, so that the machine's drift between the two
measurements of a trial is seconds, not the minutes between two servers' runs in a round (this
machine's per-round ratios spread by about 10%). Reports per level each system's medians and the
median, quartiles and every trial's ratio of output tok/s, and each trial's ratio of decode speed
(TPOT p50, llama-server's over glmserve's) (``results/compare_llama_server_paired``).

``--control`` runs llama-server on both sides (an A/A run: two starts of the same command,
``results/compare_llama_server_control`` and ``_paired_control``): how far from 1.0 the ratio
strays when nothing differs, the resolution of the measure on this machine.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rounds import alternate, check_rounds, medians, paired, paired_text, per_round, save, table  # noqa: I001
from rounds import paired_trials, paired_waves, wave_medians  # noqa: I001

from glmserve.bench.report import hardware
from glmserve.models import default_model_path
from glmserve.testing import DEFAULT_MODEL, RemoteServer

KV_BYTES_PER_CELL = 2 * 2 * 30 * 3 * 64  # SmolLM2-135M: f16 K and V, 30 layers, 3 KV heads of 64


def systems(args) -> dict[str, dict]:
    """{label: how to start it, KV cells per sequence and in all}."""
    n, ctx = args.parallel, args.n_ctx
    glm = ("--max-num-seqs", str(n), "--n-ctx", str(ctx), "--max-queue", "1024")
    llama = {"command": [args.llama_server, "-m", str(default_model_path()), "--host", "127.0.0.1",
                         "-t", str(args.threads), "-tb", str(args.threads), "-c", str(args.llama_server_ctx),
                         "-np", str(n), "--no-kv-unified", "--no-webui"],
             "cells": (args.llama_server_ctx // n, args.llama_server_ctx)}
    if args.control:
        return {f"llama-server -np {n} (A)": llama, f"llama-server -np {n} (B)": llama}
    return {
        "glmserve": {"args": glm, "cells": (ctx, n * ctx)},
        "glmserve --kv-layout unified": {"args": (*glm, "--kv-layout", "unified"), "cells": (ctx, ctx)},
        f"llama-server -np {n}": llama,
    }


def start(spec: dict, args) -> RemoteServer:
    if "command" in spec:
        return RemoteServer(command=spec["command"], startup_timeout=120)
    return RemoteServer(*spec["args"], n_threads=args.threads)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def run_paired(args, specs: dict[str, dict]) -> None:
    """``--paired``: glmserve and llama-server side by side; per level, a discarded wave on
    each, then ``args.paired`` trials of one wave on each in ``order`` (ABBA over trials)."""
    names = [next(iter(specs)), list(specs)[-1]]  # glmserve and llama-server; A and B with --control
    a, b = names
    servers = {}
    try:
        for name in names:
            servers[name] = start(specs[name], args)
        waves = paired_waves({name: servers[name].url for name in names}, args.concurrency, args.paired,
                             args.input_len, args.output_len, DEFAULT_MODEL)
    finally:
        for server in servers.values():
            server.stop()
    lines = ["| concurrency | system | output tok/s (median wave) | TTFT p50 ms | TPOT p50 ms | failed |",
             "|---:|---|---:|---:|---:|---:|"]
    checks, stats = [], {}
    for c in args.concurrency:
        for name in names:
            m = stats.setdefault(name, {})[c] = wave_medians(waves[name][c])
            lines.append(f"| {c} | {name} | {m['output_tok_s']:.1f} | {m['ttft_p50_ms']:.0f} | "
                         f"{m['tpot_p50_ms']:.2f} | {m['failed']} |")
        ratio = paired_trials(*([w.output_throughput for w in waves[name][c]] for name in names))
        q1, q3 = ratio["q1"], ratio["q3"]
        # decode speed alone: llama-server's TPOT over glmserve's (above 1: glmserve decodes faster)
        speed = paired(*([w.tpot_ms["p50"] for w in waves[name][c]] for name in reversed(names)))
        stats[a][c].update(paired_throughput=ratio, paired_decode_speed=speed)
        checks.append(f"- c={c}: output tok/s {a} / {b}, per trial: median {ratio['median']:.3f}, "
                      f"quartiles {q1:.3f} .. {q3:.3f}, range {ratio['min']:.3f} .. {ratio['max']:.3f}; "
                      f"trials: {ratio['rounds']}")
        checks.append(f"- c={c}: decode speed ({b}'s TPOT p50 / {a}'s), per trial: {paired_text(speed)}")
    report = "\n".join([
        f"hardware: {hardware()} | model: SmolLM2-135M-Instruct Q4_1 (embedded default) | threads {args.threads} | "
        f"{args.parallel} parallel sequences | input ~{args.input_len} tokens, output {args.output_len} "
        f"(ignore_eos, greedy) | both servers up at once; per level a discarded wave on each, then "
        f"{args.paired} trials of one wave of c requests on each in ABBA order; medians over the waves, and "
        f"ratios per trial", "", *lines, "", *checks])
    save(f"compare_llama_server_paired{'_control' if args.control else ''}", f"{a} vs {b}, paired waves", report, stats,
         command=" ".join(["python benchmarks/compare_llama_server.py", *sys.argv[1:]]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-server", required=True, help="path to the llama-server binary")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=8, help="max_num_seqs / llama-server -np")
    ap.add_argument("--n-ctx", type=int, default=4096, help="glmserve --n-ctx (per request)")
    ap.add_argument("--llama-server-ctx", type=int, default=8192, help="llama-server -c (shared by -np slots)")
    ap.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 16])
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--rounds", type=check_rounds, help="an even number (ABBA order; default 4); not with --paired")
    ap.add_argument("--paired", type=check_rounds, default=0, metavar="TRIALS",
                    help="both servers at once, TRIALS waves on each in ABBA order (even); see the docstring")
    ap.add_argument("--control", action="store_true", help="llama-server against itself (A/A), rounds or paired")
    args = ap.parse_args()
    if args.paired and args.rounds is not None:
        ap.error("--rounds is for the rounds of separate runs; --paired counts its own trials")
    args.rounds = args.rounds or 4
    specs = systems(args)
    if args.paired:
        run_paired(args, specs)
        return
    names = list(specs)
    rss: dict[str, list[float]] = {name: [] for name in names}
    rows = alternate(names, lambda name: start(specs[name], args), args.rounds, args.concurrency, args.input_len,
                     args.output_len, DEFAULT_MODEL, after=lambda name, srv: rss[name].append(rss_mib(srv.proc.pid)))
    stats = {name: {c: medians(rounds, c) for c in args.concurrency} for name, rounds in rows.items()}
    a, b = names[0], names[-1]  # glmserve and llama-server; A and B with --control
    ours, theirs = stats[a], stats[b]
    lines = table(stats, args.concurrency)
    memory = ["| system | KV cells per sequence | KV cells in all | KV cache MiB | per sequence MiB | "
              "server RSS MiB (max over rounds) |", "|---|---:|---:|---:|---:|---:|"]
    for name in names:
        per_seq, total = specs[name]["cells"]
        memory.append(f"| {name} | {per_seq} | {total} | {total * KV_BYTES_PER_CELL / 2**20:.0f} | "
                      f"{total * KV_BYTES_PER_CELL / 2**20 / args.parallel:.1f} | {max(rss[name]):.0f} |")
    checks = []
    for c in args.concurrency:
        o, t = ours[c], theirs[c]
        throughput = paired(per_round(rows[a], c), per_round(rows[b], c))
        tpot = paired(*(per_round(rows[n], c, lambda s: s.tpot_ms["p50"]) for n in (a, b)))
        o.update(paired_throughput=throughput, paired_tpot_p50=tpot)
        checks.append(f"- c={c}: output tok/s {a} / {b} {paired_text(throughput)}; TPOT p50 "
                      f"{paired_text(tpot)} ({o['tpot_p50_ms']:.1f} vs {t['tpot_p50_ms']:.1f} ms); TTFT p50 "
                      f"{o['ttft_p50_ms']:.0f} vs {t['ttft_p50_ms']:.0f} ms")
    checks.append(f"- failed {a} requests over all levels and rounds: "
                  f"{sum(m['failed'] for m in ours.values())}")
    report = "\n".join([
        f"hardware: {hardware()} | model: SmolLM2-135M-Instruct Q4_1 (embedded default) | threads {args.threads} | "
        f"{args.parallel} parallel sequences | input ~{args.input_len} tokens, output {args.output_len} "
        f"(ignore_eos, greedy) | requests per level: max(8, 4 x concurrency), after a discarded wave of c | "
        f"{args.rounds} rounds in ABBA order; medians, and ratios as the median of per-round ratios", "", *lines, "", *memory, "", *checks])
    save("compare_llama_server_control" if args.control else "compare_llama_server",
         "llama-server vs llama-server (A/A control)" if args.control else "glmserve vs llama-server", report, stats,
         command=" ".join(["python benchmarks/compare_llama_server.py", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
