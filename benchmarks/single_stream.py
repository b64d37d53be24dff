"""Single-stream decode speed: glmserve over HTTP vs llama-cpp-python in-process.

Both run the same GGUF with the same threads, greedy, ``ignore_eos``-style fixed output length,
in one run of this script. glmserve is measured through its SSE stream with the official
``openai`` client; llama-cpp-python through ``Llama.create_chat_completion(stream=True)``.
Decode speed = (output tokens - 1) / (time of last token - time of first token), i.e. 1/TPOT;
TTFT is measured too. Prints a table.

    python benchmarks/single_stream.py [--threads 2] [--output-len 128] [--runs 3]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

from glmserve.models import default_model_path
from glmserve.testing import DEFAULT_MODEL, RemoteServer

PROMPT = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]


def _cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _timed(chunks) -> tuple[float, float, int]:
    """(ttft_s, decode_tokens_per_s, tokens) from an iterator of text pieces started now."""
    start = time.perf_counter()
    times = [time.perf_counter() for piece in chunks if piece]
    n = len(times)
    decode = (n - 1) / (times[-1] - times[0]) if n > 1 else float("nan")
    return times[0] - start, decode, n


def bench_glmserve(threads: int, output_len: int, runs: int) -> list[tuple[float, float, int]]:
    server = RemoteServer(n_threads=threads)
    try:
        client = server.client()

        def once():
            stream = client.chat.completions.create(
                model=DEFAULT_MODEL, messages=PROMPT, temperature=0, max_tokens=output_len, stream=True,
                extra_body={"ignore_eos": True})
            return _timed(c.choices[0].delta.content for c in stream if c.choices)

        once()  # warm-up
        return [once() for _ in range(runs)]
    finally:
        server.stop()


def bench_llama_cpp_python(threads: int, output_len: int, runs: int) -> list[tuple[float, float, int]]:
    import llama_cpp

    llm = llama_cpp.Llama(str(default_model_path()), n_ctx=4096, n_threads=threads, n_threads_batch=threads,
                          verbose=False)
    eos = llm.token_eos()

    def once():
        # logit_bias forbids end-of-turn so that exactly output_len tokens come out, like ignore_eos
        stream = llm.create_chat_completion(PROMPT, temperature=0, max_tokens=output_len, stream=True,
                                            logit_bias={eos: -1e9, 2: -1e9})
        return _timed(c["choices"][0]["delta"].get("content") for c in stream)

    once()
    results = [once() for _ in range(runs)]
    llm.close()
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    rows = [
        ("glmserve (HTTP SSE, openai client)", bench_glmserve(args.threads, args.output_len, args.runs)),
        ("llama-cpp-python create_chat_completion", bench_llama_cpp_python(args.threads, args.output_len, args.runs)),
    ]
    print(f"\nhardware: {_cpu_name()}, threads={args.threads} | model: {DEFAULT_MODEL} Q4_1 | "
          f"output tokens: {args.output_len}, greedy, concurrency 1, runs: {args.runs} (median)\n")
    print(f"| {'system':<42} | {'decode tok/s':>12} | {'TTFT ms':>8} | {'pieces':>6} |")
    print(f"|{'-' * 44}|{'-' * 14}|{'-' * 10}|{'-' * 8}|")
    for name, results in rows:
        ttft = statistics.median(r[0] for r in results) * 1000
        decode = statistics.median(r[1] for r in results)
        pieces = statistics.median(r[2] for r in results)
        print(f"| {name:<42} | {decode:>12.1f} | {ttft:>8.1f} | {pieces:>6.0f} |")


if __name__ == "__main__":
    main()
