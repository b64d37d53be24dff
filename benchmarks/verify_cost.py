"""What a speculative verification step costs on llama.cpp's CPU backend, and why its greedy
output can differ from plain decoding after a few hundred tokens.

1. Cost: one ``llama_decode`` of ``k`` rows of one sequence (its last token plus ``k - 1`` draft
   tokens, logits on every row) after a context of ``--context`` tokens, on a context built as
   glmserve builds it (split KV layout, ``n_batch`` 63, 8 sequences of ``--n-ctx`` cells).
   Speculation pays when a step's accepted tokens are worth more than its extra rows.
2. Numerics: the logits of the same row computed alone (``k = 1``) and among ``k`` rows, for a
   context below and above 512 KV cells. llama.cpp's CPU flash attention splits the KV range of a
   lone query row over the threads from 512 cells on (``use_split_kv_path`` in
   ``ggml-cpu/ops.cpp``) and reduces the partial sums; a row among others is summed in one pass.
   Rows computed among 2 to 63 others are bit-identical whatever their number.

Alternating repetitions, medians. Prints the tables and keeps them in
``results/verify_cost.md``.

    python benchmarks/verify_cost.py [--context 600] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import llama_cpp
import numpy as np
from llama_cpp._internals import LlamaModel

from glmserve.bench.report import hardware
from glmserve.models import default_model_path
from rounds import save  # benchmarks/rounds.py

ROWS = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 63]


class OneSequence:
    """A glmserve-shaped llama.cpp context; ``decode(tokens, start)`` decodes them as sequence 0
    at positions ``start...`` and returns every row's logits; ``trim(p)`` drops cells >= p."""

    def __init__(self, model: LlamaModel, n_ctx: int, threads: int) -> None:
        params = llama_cpp.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch, params.n_seq_max = 8 * n_ctx, 63, 63, 8
        params.n_threads = params.n_threads_batch = threads
        params.kv_unified, params.no_perf = False, True
        self.ctx = llama_cpp.llama_init_from_model(model.model, params)
        self.memory = llama_cpp.llama_get_memory(self.ctx)
        self.batch = llama_cpp.llama_batch_init(64, 0, 1)
        self.n_vocab = llama_cpp.llama_n_vocab(llama_cpp.llama_model_get_vocab(model.model))

    def decode(self, tokens: list[int], start: int, logits: bool = True) -> list[np.ndarray]:
        b = self.batch
        for i, t in enumerate(tokens):
            b.token[i], b.pos[i], b.n_seq_id[i], b.seq_id[i][0] = t, start + i, 1, 0
            b.logits[i] = 1 if logits or i == len(tokens) - 1 else 0
        b.n_tokens = len(tokens)
        if llama_cpp.llama_decode(self.ctx, b) != 0:
            raise RuntimeError("llama_decode failed")
        rows = range(len(tokens)) if logits else ()
        return [np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self.ctx, i), shape=(self.n_vocab,)).copy()
                for i in rows]

    def prefill(self, tokens: list[int]) -> None:
        self.trim(0)
        for p in range(0, len(tokens), 63):
            self.decode(tokens[p:p + 63], p, logits=False)

    def trim(self, p0: int) -> None:
        llama_cpp.llama_memory_seq_rm(self.memory, 0, p0, -1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, default=600, help="tokens before the verified rows")
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    model = LlamaModel(path_model=str(default_model_path()), params=llama_cpp.llama_model_default_params(),
                       verbose=False)
    seq = OneSequence(model, args.n_ctx, args.threads)
    tokens = [int(t) for t in np.random.default_rng(0).integers(100, 20000, args.context + 64)]
    seq.prefill(tokens[:args.context])
    times: dict[int, list[float]] = {k: [] for k in ROWS}
    for _ in range(args.repeats):
        for k in ROWS:
            start = time.perf_counter()
            seq.decode(tokens[args.context:args.context + k], args.context)
            times[k].append((time.perf_counter() - start) * 1000)
            seq.trim(args.context)
    one = statistics.median(times[1])
    lines = [f"hardware: {hardware()} | model: SmolLM2-135M-Instruct Q4_1 (embedded default) | threads "
             f"{args.threads} | context {args.context} tokens | {args.repeats} alternating repetitions, medians", "",
             "| rows (last token + draft) | ms per decode | x one row | ms per extra row |", "|---:|---:|---:|---:|"]
    stats: dict = {"ms_per_decode": {}}
    for k in ROWS:
        ms = statistics.median(times[k])
        stats["ms_per_decode"][k] = ms
        extra = "-" if k == 1 else f"{(ms - one) / (k - 1):.2f}"
        lines.append(f"| {k} | {ms:.2f} | {ms / one:.2f} | {extra} |")
    lines += ["", "| context (tokens) | max abs logit difference, row alone vs among 2 / 16 / 63 rows | "
              "among 2 vs among 63 |", "|---:|---|---:|"]
    for context in (200, 300, 600):
        seq.prefill(tokens[:context])
        alone = seq.decode([tokens[context]], context)[0]
        seq.trim(context)
        among = {}
        for k in (2, 16, 63):
            among[k] = seq.decode(tokens[context:context + k], context)[0]
            seq.trim(context)
        diffs = " / ".join(f"{float(np.abs(alone - among[k]).max()):.3g}" for k in (2, 16, 63))
        lines.append(f"| {context} | {diffs} | {float(np.abs(among[2] - among[63]).max()):.3g} |")
    save("verify_cost", "What a verification step costs", "\n".join(lines), stats,
         command=" ".join(["python benchmarks/verify_cost.py", *sys.argv[1:]]))

if __name__ == "__main__":
    main()
