"""glmserve at ``--stream-interval-ms 0`` (the default: every step's tokens handed over as they
come) against another interval (default 50), in paired waves of one run.

Both servers run at once (the embedded default GGUF, the same threads, 8 parallel sequences),
each idle but for the wave it is sent; per level, a discarded wave on each, then TRIALS trials
of one wave of c streaming greedy requests (ignore_eos) on each, the same prompts, in ABBA order
(``rounds.paired_waves``). Reports per level each server's medians, the median, quartiles and
every trial's ratio of output tok/s (interval over 0) and of decode speed (TPOT p50, 0's over
the interval's), and each server's ITL p50: the gap between the chunks a client reads, which a
longer interval widens (``results/stream_interval``).

    python benchmarks/stream_interval.py --concurrency 1,8 --trials 20 [--interval 50]
"""

from __future__ import annotations

import argparse
import sys

from rounds import check_rounds, paired_trials, paired_text, paired_waves, save, wave_medians  # noqa: I001

from glmserve.bench.report import hardware
from glmserve.testing import DEFAULT_MODEL, RemoteServer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--interval", type=float, default=50, help="--stream-interval-ms set against 0")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=8, help="--max-num-seqs")
    ap.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8])
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--trials", type=check_rounds, default=20, help="an even number (ABBA order)")
    args = ap.parse_args()
    if args.interval <= 0:
        ap.error("--interval: a number of ms above 0, set against 0")
    base, other = "--stream-interval-ms 0", f"--stream-interval-ms {args.interval:g}"
    servers = {}
    try:
        for label in (base, other):
            servers[label] = RemoteServer("--max-num-seqs", str(args.parallel), *label.split(),
                                          n_threads=args.threads)
        waves = paired_waves({label: server.url for label, server in servers.items()}, args.concurrency,
                             args.trials, args.input_len, args.output_len, DEFAULT_MODEL)
    finally:
        for server in servers.values():
            server.stop()
    lines = ["| concurrency | system | output tok/s (median wave) | TTFT p50 ms | TPOT p50 ms | ITL p50 ms | failed |",
             "|---:|---|---:|---:|---:|---:|---:|"]
    checks, stats = [], {}
    for c in args.concurrency:
        for label in (base, other):
            m = stats.setdefault(label, {})[c] = wave_medians(waves[label][c])
            lines.append(f"| {c} | glmserve {label} | {m['output_tok_s']:.1f} | {m['ttft_p50_ms']:.0f} | "
                         f"{m['tpot_p50_ms']:.2f} | {m['itl_p50_ms']:.1f} | {m['failed']} |")
        ratio = paired_trials(*([w.output_throughput for w in waves[label][c]] for label in (other, base)))
        speed = paired_trials(*([w.tpot_ms["p50"] for w in waves[label][c]] for label in (base, other)))
        stats[other][c].update(paired_throughput=ratio, paired_decode_speed=speed)
        checks.append(f"- c={c}: output tok/s {other} / 0, per trial: median {ratio['median']:.3f}, quartiles "
                      f"{ratio['q1']:.3f} .. {ratio['q3']:.3f}, range {ratio['min']:.3f} .. {ratio['max']:.3f}; "
                      f"trials: {ratio['rounds']}")
        checks.append(f"- c={c}: decode speed (TPOT p50 at 0 / at {args.interval:g}), per trial: "
                      f"{paired_text(speed)}")
    report = "\n".join([
        f"hardware: {hardware()} | model: SmolLM2-135M-Instruct Q4_1 (embedded default) | threads {args.threads} | "
        f"{args.parallel} parallel sequences | input ~{args.input_len} tokens, output {args.output_len} (ignore_eos, "
        f"greedy) | both servers up at once; per level a discarded wave on each, then {args.trials} trials of one "
        f"wave of c requests on each in ABBA order; medians over the waves, and ratios per trial", "", *lines, "",
        *checks])
    save("stream_interval", "glmserve --stream-interval-ms, paired waves", report, stats,
         command=" ".join(["python benchmarks/stream_interval.py", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
