"""The same SmolLM2-135M-Instruct weights on glmserve's two CPU engines, under the same load.

``llama_cpp`` serves the embedded Q4_1 GGUF; ``transformers`` serves the same GGUF through
transformers' ``gguf_file=`` loader (dequantized to ``--dtype``, float32 by default, at
start-up). The load is ``glmserve bench`` (streaming, greedy, ignore_eos, fixed output length)
at concurrency 1 and 8, both engines with ``--max-num-seqs 8`` and the same threads, in
alternating rounds (each round starts each engine in turn, the order rotating). Prints medians
over the rounds and writes them to benchmarks/results/transformers_vs_llama_cpp[_DTYPE].md.

    python benchmarks/transformers_vs_llama_cpp.py [--rounds 4] [--threads 2] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse

from rounds import alternate, check_rounds, medians, save, table  # benchmarks/rounds.py

from glmserve.bench.report import hardware
from glmserve.models import default_model_path
from glmserve.testing import DEFAULT_MODEL, RemoteServer


def engines(dtype: str) -> dict[str, list[str]]:
    return {
        "llama_cpp (Q4_1)": ["--engine", "llama_cpp"],
        f"transformers ({dtype})": ["--engine", "transformers", "--model", str(default_model_path()), "--dtype", dtype,
                                    "--served-model-name", DEFAULT_MODEL],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=8, help="--max-num-seqs of both engines")
    ap.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8])
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--rounds", type=check_rounds, default=4, help="an even number (ABBA order)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                    help="the transformers engine's weights")
    args = ap.parse_args()
    specs = engines(args.dtype)
    names = list(specs)
    rows = alternate(names, lambda name: RemoteServer(*specs[name], "--max-num-seqs", str(args.parallel),
                                                       n_threads=args.threads, startup_timeout=300),
                     args.rounds, args.concurrency, args.input_len, args.output_len, DEFAULT_MODEL)
    stats = {name: {c: medians(rounds, c) for c in args.concurrency} for name, rounds in rows.items()}
    ratios = [f"- c={c}: output tok/s llama_cpp / transformers "
              f"{stats[names[0]][c]['output_tok_s'] / stats[names[1]][c]['output_tok_s']:.2f}x"
              for c in args.concurrency]
    report = "\n".join([
        f"hardware: {hardware()} | model: SmolLM2-135M-Instruct (the embedded GGUF) | threads {args.threads} | "
        f"max_num_seqs {args.parallel} | input ~{args.input_len} tokens, output {args.output_len} (ignore_eos, "
        f"greedy) | requests per level: max(8, 4 x concurrency) | {args.rounds} alternating rounds, medians",
        "", *table(stats, args.concurrency), "", *ratios])
    stem = "transformers_vs_llama_cpp" + ("" if args.dtype == "float32" else f"_{args.dtype}")
    save(stem, "transformers vs llama_cpp engine", report, stats,
         command=f"python benchmarks/transformers_vs_llama_cpp.py --dtype {args.dtype}")


if __name__ == "__main__":
    main()
