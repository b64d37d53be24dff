"""MTP speculative decoding (``--speculative mtp``) against decoding without it, paired, on a tiny
GLM-4.5 whose NextN layer is trained to predict the token after next.

No GLM checkpoint can be downloaded here, so the model is built and trained in the run
(``tests/hf_models.py`` ``tiny_glm_mtp_trained``: 2 layers, hidden size 64, a NextN layer; under
a minute): trained to answer one question with a fixed Python function, its NextN layer then
trained on the same answer. A model that small decodes a step in tens of microseconds, where
the engine's own per-step work and the MTP step cost as much as the model, not what a real
GLM's step costs: by default (``--widen``) the trained model is zero-padded to hidden size 1024
(MLPs to 4096, experts to 1024) with 10 leading decoder layers whose projections are zero
(``widened_glm``): the same answer, but each decode step reads ~350 MB of f16 weights, as a
bandwidth-bound model's does, while an MTP step reads one layer's. Converted by llama.cpp's own
converter (what ``make install`` extracts): f16 (``--no-widen``: the 2-layer model, f32). A real
checkpoint's NextN layer is right less often (GLM-4.5's MTP acceptance is reported at 60-90%),
so the figure shows what the mechanism gives where the drafts are right.

Two servers of that GGUF (the same threads, ``--max-num-seqs 1``): ``glmserve`` and ``glmserve
--speculative mtp``. After a warm-up pair, each request (the trained question, greedy, streamed) is
sent to each server in turn, in ABBA order (``rounds.order``), one request at a time; per request,
decode tok/s is its tokens after the first over the time from its first token to its last. Every
answer must be the trained one. Prints the medians, the speed-up as the median of the pairs'
ratios with their range (docs/engineering/measuring.md), and the draft acceptance from
``/metrics``, and keeps them in ``results/mtp.md`` and ``.json``.

    python benchmarks/mtp.py [--requests 10] [--threads 2] [--no-widen]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import sys
import tempfile
from pathlib import Path

import httpx
from rounds import check_rounds, order, paired, paired_text, save, stream_chat  # noqa: I001

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from glmserve.bench.report import hardware  # noqa: E402
from glmserve.testing import RemoteServer  # noqa: E402
from tests.hf_models import converted_gguf, tiny_glm_mtp_trained, widened_glm  # noqa: E402

MODEL = "tiny-glm-4.5-mtp"
QUESTION = [{"role": "user", "content": "Write the function."}]
ANSWER = ('def total(values, rate):\n    """Sum the values, each times the rate."""\n    result = 0\n'
          "    for value in values:\n        result += value * rate\n    return result\n")
WIDE = {"hidden_size": 1024, "intermediate_size": 4096, "moe_intermediate_size": 1024, "leading_layers": 10}


def build(root: Path, widen: bool) -> Path:
    converter = Path(sys.prefix) / "share" / "llama.cpp" / "convert_hf_to_gguf.py"
    folder = tiny_glm_mtp_trained(root / MODEL, QUESTION, ANSWER)
    if widen:
        folder = widened_glm(folder, root / f"{MODEL}-wide", **WIDE)
    return converted_gguf(folder, root / f"{MODEL}.gguf", converter, tokenizer_pre="glm4",
                          outtype="f16" if widen else "f32")


def counters(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics").text
    return {name: float(value) for name, value in
            re.findall(r"^glmserve:spec_decode_(\w+)_total\{[^}]*\} (\S+)$", text, re.M)}


async def one(url: str) -> tuple[float, int, str]:
    body = {"model": MODEL, "messages": QUESTION, "temperature": 0, "max_tokens": 400, "stream": True,
            "stream_options": {"include_usage": True}}
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        r = await stream_chat(client, body)
    tokens = r["usage"]["completion_tokens"]
    return (tokens - 1) / (r["end"] - r["first"]), tokens, r["text"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=check_rounds, default=10, help="per system, an even number (ABBA order)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--widen", action=argparse.BooleanOptionalAction, default=True)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        gguf = build(Path(tmp), args.widen)
        flags = ("--model", str(gguf), "--served-model-name", MODEL, "--max-num-seqs", "1")
        systems = {"glmserve": RemoteServer(*flags, n_threads=args.threads),
                   "glmserve --speculative mtp": RemoteServer(*flags, "--speculative", "mtp", n_threads=args.threads)}
        try:
            rates: dict[str, list[float]] = {name: [] for name in systems}
            lengths = set()
            for i in range(args.requests + 1):
                for name in order(list(systems), i - 1):
                    rate, tokens, text = asyncio.run(one(systems[name].url))
                    if text != ANSWER.rstrip("\n"):  # the newline before <|user|> is trimmed
                        raise SystemExit(f"{name} answered {text!r}, not the trained answer")
                    if i:  # the first pair warms up
                        rates[name].append(rate)
                    lengths.add(tokens)
            spec = counters(systems["glmserve --speculative mtp"].url)
        finally:
            for server in systems.values():
                server.stop()
    base, mtp = (statistics.median(rates[name]) for name in systems)
    speedup = paired(*(rates[name] for name in reversed(list(systems))))
    acceptance = spec["num_accepted_tokens"] / max(spec["num_draft_tokens"], 1)
    shape = ("widened to hidden 1024, MLPs 4096, experts 1024, 10 leading zero layers (12 layers); f16 GGUF"
             if args.widen else "2 layers, hidden 64; f32 GGUF")
    report = "\n".join([
        f"Hardware: {hardware()}; {args.threads} threads. Model: {MODEL} (trained here: 2 layers, hidden 64, "
        f"one NextN layer; {shape}). One request at a time, {args.requests} per system, paired, greedy; "
        f"output {sorted(lengths)} tokens; every answer the trained one.",
        "",
        "| system | decode tok/s (median) | vs no speculation | drafts | draft tokens | accepted |",
        "|---|---:|---:|---:|---:|---:|",
        f"| glmserve | {base:.1f} | 1.00x | | | |",
        f"| glmserve --speculative mtp | {mtp:.1f} | {speedup['median']:.2f}x | {spec['num_drafts']:.0f} | "
        f"{spec['num_draft_tokens']:.0f} | {spec['num_accepted_tokens']:.0f} ({acceptance:.0%}) |",
        "",
        f"Speed-up, the median of the pairs' ratios: {paired_text(speedup)}",
    ])
    save("mtp", "MTP speculative decoding, paired", report,
         {"decode_tok_s": rates, "paired_speedup": speedup, "spec_decode": spec, "output_tokens": sorted(lengths)},
         command=f"python benchmarks/mtp.py --requests {args.requests} --threads {args.threads}"
                 + ("" if args.widen else " --no-widen"))


if __name__ == "__main__":
    main()
