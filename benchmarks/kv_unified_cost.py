"""Cost of llama.cpp's unified KV cache at the decode step, measured directly at the llama.cpp level.

``--sequences`` (8) sequences are prefilled with ``--prompt-len`` tokens each, then a decode
step of one token per sequence is timed (``--sequences 1``: a single request's decode step),
with the KV cache unified (one pool shared by all sequences:
``glmserve --kv-layout unified``) and split in one stream per sequence (``--kv-layout split``,
glmserve's and llama-server's default). Same model, threads and context. Prints a table.

    python benchmarks/kv_unified_cost.py [--threads 2] [--sequences 8] [--prompt-len 160] [--steps 40]
"""

from __future__ import annotations

import argparse
import statistics
import time

import llama_cpp
from llama_cpp._internals import LlamaModel

from rounds import check_rounds, order, paired, paired_text  # benchmarks/rounds.py  # noqa: I001

from glmserve.bench.report import hardware
from glmserve.models import default_model_path


def _context(model: LlamaModel, n_seq: int, threads: int, unified: bool):
    params = llama_cpp.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_ubatch, params.n_seq_max = 4096, 63, 63, n_seq
    params.n_threads = params.n_threads_batch = threads
    params.kv_unified = unified
    return llama_cpp.llama_init_from_model(model.model, params)


def _decode(ctx, rows: list[tuple[int, int, int]]) -> None:
    """rows: (seq_id, token, pos); logits for every row."""
    batch = llama_cpp.llama_batch_init(len(rows), 0, 1)
    for i, (seq, token, pos) in enumerate(rows):
        batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = token, pos, 1, 1
        batch.seq_id[i][0] = seq
    batch.n_tokens = len(rows)
    try:
        if llama_cpp.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")
    finally:
        llama_cpp.llama_batch_free(batch)


def measure(model: LlamaModel, unified: bool, args) -> float:
    ctx = _context(model, 8, args.threads, unified)
    prompt = model.tokenize(b"The quick brown fox jumps over the lazy dog. " * 40, False, False)[: args.prompt_len]
    for seq in range(args.sequences):
        for start in range(0, len(prompt), 63):
            _decode(ctx, [(seq, t, start + i) for i, t in enumerate(prompt[start:start + 63])])
    times = []
    for k in range(args.steps):
        t = time.perf_counter()
        _decode(ctx, [(seq, 100 + k, len(prompt) + k) for seq in range(args.sequences)])
        times.append(time.perf_counter() - t)
    llama_cpp.llama_free(ctx)
    return statistics.median(times) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sequences", type=int, choices=range(1, 9), default=8, metavar="1..8",
                    help="sequences decoded together (the context holds 8)")
    ap.add_argument("--prompt-len", type=int, default=160)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--rounds", type=check_rounds, default=6, help="an even number (ABBA order)")
    args = ap.parse_args()
    model = LlamaModel(path_model=str(default_model_path()), params=llama_cpp.llama_model_default_params(),
                       verbose=False)
    runs = []
    for r in range(args.rounds):  # ABBA: each cache measured first equally often
        step = {u: measure(model, u, args) for u in order([False, True], r)}
        runs.append((step[False], step[True]))
    ratio = paired([u for _, u in runs], [s for s, _ in runs])
    split = statistics.median(s for s, _ in runs)
    unified = statistics.median(u for _, u in runs)
    print(f"\nhardware: {hardware()} | model: SmolLM2-135M-Instruct Q4_1 | threads {args.threads} | n_ctx 4096 | "
          f"{args.sequences} of 8 sequences x {args.prompt_len} cached tokens | decode step of {args.sequences} "
          f"tokens: median of {args.steps} steps, "
          f"{args.rounds} rounds in ABBA order\n")
    print("| KV cache | decode step ms (median of rounds) | unified / split per round |\n|---|---:|---:|")
    print(f"| split, one stream per sequence (glmserve and llama-server default) | {split:.1f} | |")
    print(f"| unified (glmserve --kv-layout unified) | {unified:.1f} | {paired_text(ratio)} |")


if __name__ == "__main__":
    main()
