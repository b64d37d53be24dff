"""The same SmolLM2-135M-Instruct weights on glmserve's two CPU engines, under the same load.

``llama_cpp`` serves the embedded Q4_1 GGUF; ``transformers`` serves the same GGUF through
transformers' ``gguf_file=`` loader (dequantized to ``--dtype``, float32 by default, at
start-up). The load is ``glmserve bench`` (streaming, greedy, ignore_eos, fixed output length)
at concurrency 1 and 8, both engines with ``--max-num-seqs 8`` and the same threads. Prints one
table and writes it to benchmarks/results/transformers_vs_llama_cpp[_DTYPE].md.

    python benchmarks/transformers_vs_llama_cpp.py [--threads 2] [--output-len 128] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import json

from compare_llama_server import RESULTS, run_levels, table

from glmserve.bench.metrics import Summary
from glmserve.bench.report import hardware
from glmserve.models import default_model_path
from glmserve.testing import RemoteServer

def engines(dtype: str) -> dict[str, list[str]]:
    return {
        "llama_cpp (Q4_1)": ["--engine", "llama_cpp"],
        f"transformers ({dtype})": ["--engine", "transformers", "--model", str(default_model_path()), "--dtype", dtype],
    }


def bench(args, flags: list[str], label: str) -> list[Summary]:
    server = RemoteServer(*flags, "--max-num-seqs", str(args.parallel), n_threads=args.threads)
    try:
        return run_levels(server.url, label, args)
    finally:
        server.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=8, help="--max-num-seqs of both engines")
    ap.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8])
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                    help="the transformers engine's weights")
    args = ap.parse_args()
    rows = {label: bench(args, flags, label) for label, flags in engines(args.dtype).items()}
    lines = []
    for label, summaries in rows.items():
        by = {s.concurrency: s for s in summaries}
        if 1 in by and 8 in by:
            lines.append(f"- {label}: c=8 / c=1 throughput {by[8].output_throughput / by[1].output_throughput:.2f}x")
    report = "\n".join([
        f"hardware: {hardware()} | model: SmolLM2-135M-Instruct (the embedded GGUF) | threads {args.threads} | "
        f"max_num_seqs {args.parallel} | input ~{args.input_len} tokens, output {args.output_len} (ignore_eos, "
        "greedy) | requests per level: max(8, 4 x concurrency)",
        "", table(rows), "", *lines,
    ])
    print(report)
    RESULTS.mkdir(exist_ok=True)
    stem = "transformers_vs_llama_cpp" + ("" if args.dtype == "float32" else f"_{args.dtype}")
    (RESULTS / f"{stem}.md").write_text(
        f"# transformers vs llama_cpp engine\n\n`python benchmarks/transformers_vs_llama_cpp.py --dtype {args.dtype}`\n\n"
        + report + "\n")
    (RESULTS / f"{stem}.json").write_text(json.dumps(
        {name: [s.to_dict() for s in summaries] for name, summaries in rows.items()}, indent=2))


if __name__ == "__main__":
    main()
