"""Load and unload a model many times in one process: is memory flat, and what does a cold load
cost a request's time to first token compared with a warm one?

Each cycle does what a server serving many models does for one of them: build and start the
model (``glmserve.runtime.start.start_model``: engine, chat template, chat service), answer a
streamed chat request (cold: the clock starts before the load), answer the same kind of request
again (warm), embed one text (the llama_cpp engine's embedding context is made and freed with
it), then shut the engine down. After each cycle it reads the process's resident memory
(``VmRSS``) and its anonymous part (``RssAnon``: heap and engine buffers, without the model
file's mapped pages), which is where a leak shows.

With ``--lora FILE`` it then loads and unloads that LoRA adapter ``--cycles`` times on one
engine (``load_lora_adapter`` / ``unload_lora_adapter``, as ``/v1/load_lora_adapter`` does), with
a request on the adapter each time, and reads memory the same way.

    python benchmarks/load_unload.py [--cycles 50] [--model PATH] [--lora tuned.gguf]

A GGUF LoRA adapter for the embedded model, as the tests build one (needs the test extras)::

    python -c "from pathlib import Path; from tests.hf_models import *; \
      gguf_lora(lora_adapter(smollm2_folder(Path('/tmp/hf')), Path('/tmp/ad'), scale=0.05, \
      target_modules=('v_proj', 'o_proj')), Path('/tmp/tuned.gguf'))"
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import sys
import time
from pathlib import Path

from rounds import memory_mib, save  # benchmarks/rounds.py

from glmserve.bench.report import hardware
from glmserve.protocol.chat import ChatCompletionRequest
from glmserve.runtime.start import start_model
from glmserve.settings.serve import ServeSettings

QUESTIONS = ["What is the capital of France?", "Name a famous painter.", "List three fruits.", "What is 2 + 2?"]


async def first_token_s(chat, model: str, question: str, max_tokens: int, t0: float) -> float:
    """Seconds from ``t0`` to the first content of a streamed greedy reply (which is then read
    to its end)."""
    req = ChatCompletionRequest(model=model, messages=[{"role": "user", "content": question}], temperature=0,
                                max_tokens=max_tokens, stream=True)
    first = None
    async for chunk in await chat.create(req):
        if first is None and getattr(chunk, "choices", None) and chunk.choices[0].delta.content:
            first = time.perf_counter() - t0
    if first is None:
        raise RuntimeError("the reply had no content")
    return first


def model_cycles(settings: ServeSettings, cycles: int, max_tokens: int) -> list[dict]:
    rows = []
    for i in range(cycles):
        question = QUESTIONS[i % len(QUESTIONS)]
        t0 = time.perf_counter()
        loaded = start_model(settings)
        load_s = time.perf_counter() - t0
        try:
            chat = loaded.chat
            cold = asyncio.run(first_token_s(chat, loaded.pipeline.name, question, max_tokens, t0))
            warm = asyncio.run(first_token_s(chat, loaded.pipeline.name, question, max_tokens, time.perf_counter()))
            if loaded.engine.model_info.embedding_size is not None:
                asyncio.run(loaded.engine.embed(loaded.engine.tokenizer.encode_prompt(question)))
        finally:
            loaded.engine.shutdown()
        del loaded, chat
        gc.collect()
        rss, anon = memory_mib()
        rows.append({"cycle": i + 1, "load_s": load_s, "cold_ttft_s": cold, "warm_ttft_s": warm, "rss_mib": rss,
                     "anon_mib": anon})
        print(f"cycle {i + 1}: load {load_s:.2f} s, cold TTFT {cold:.2f} s, warm TTFT {warm * 1000:.0f} ms, "
              f"RSS {rss:.0f} MiB (anonymous {anon:.0f})", flush=True)
    return rows


def lora_cycles(settings: ServeSettings, path: Path, cycles: int, max_tokens: int) -> list[dict]:
    loaded = start_model(settings)
    rows = []
    try:
        engine, chat = loaded.engine, loaded.chat

        async def cycle(i: int) -> None:
            await engine.load_lora_adapter("tuned", str(path))
            await first_token_s(chat, "tuned", QUESTIONS[i % len(QUESTIONS)], max_tokens, time.perf_counter())
            await engine.unload_lora_adapter("tuned")

        for i in range(cycles):
            asyncio.run(cycle(i))
            gc.collect()
            rss, anon = memory_mib()
            rows.append({"cycle": i + 1, "rss_mib": rss, "anon_mib": anon})
    finally:
        loaded.engine.shutdown()
    return rows


def memory_table(rows: list[dict], what: str) -> list[str]:
    """RSS at a few cycles, and the growth per cycle over the second half of the cycles (the
    first ones warm up: allocator pools and caches that fill once)."""
    marks = sorted({1, 2, 5, 10, *range(10, len(rows) + 1, 10), len(rows)} & set(range(1, len(rows) + 1)))
    lines = [f"| {what}: after cycle | RSS MiB | anonymous MiB |", "|---:|---:|---:|"]
    lines += [f"| {m} | {rows[m - 1]['rss_mib']:.0f} | {rows[m - 1]['anon_mib']:.0f} |" for m in marks]
    half = len(rows) // 2
    if half >= 1:
        growth = {key: (rows[-1][key] - rows[half - 1][key]) / (len(rows) - half) * 1024
                  for key in ("rss_mib", "anon_mib")}
        lines.append(f"\nGrowth per cycle from cycle {half} to {len(rows)}: RSS {growth['rss_mib']:+.0f} KiB, "
                     f"anonymous {growth['anon_mib']:+.0f} KiB")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=50)
    parser.add_argument("--model", default=None, help="default: the embedded SmolLM2 GGUF")
    parser.add_argument("--engine", default="llama_cpp")
    parser.add_argument("--n-threads", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--lora", type=Path, default=None, help="a LoRA adapter to load and unload as many times")
    args = parser.parse_args()
    settings = ServeSettings(engine=args.engine, n_threads=args.n_threads,
                             **({"model": args.model} if args.model else {}))
    rows = model_cycles(settings, args.cycles, args.max_tokens)
    lora_rows = lora_cycles(settings, args.lora, args.cycles, args.max_tokens) if args.lora else []
    med = {key: statistics.median(r[key] for r in rows) for key in ("load_s", "cold_ttft_s", "warm_ttft_s")}
    model = rows and (args.model or "SmolLM2-135M-Instruct Q4_1 GGUF (embedded)")
    lines = [f"hardware: {hardware()} | model: {model} | engine {args.engine}, {args.n_threads} threads | "
             f"{args.cycles} cycles | replies of {args.max_tokens} tokens, greedy, streamed", "",
             "| per cycle (median) | seconds |", "|---|---:|",
             f"| load (start_model) | {med['load_s']:.2f} |",
             f"| cold request: TTFT from before the load | {med['cold_ttft_s']:.2f} |",
             f"| warm request: TTFT | {med['warm_ttft_s']:.3f} |", "",
             *memory_table(rows, "model load/unload")]
    if lora_rows:
        lines += ["", f"LoRA adapter {args.lora.name}: load, one request, unload, {args.cycles} times on one engine",
                  "", *memory_table(lora_rows, "adapter load/unload")]
    save("load_unload", "Load and unload the model repeatedly: memory and cold vs warm TTFT", "\n".join(lines),
         {"cycles": rows, "lora_cycles": lora_rows, "medians": med},
         command=" ".join(["python benchmarks/load_unload.py", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
