"""glmserve vs llama.cpp's C++ ``llama-server`` under the same load, in one run.

Both serve the embedded default GGUF with the same threads and 8 parallel sequences; the load is
``glmserve bench`` (streaming, greedy, ignore_eos, fixed output length) at each concurrency.
llama-server runs twice: as the issue names it (``-np 8``, which splits the KV cache into fixed
per-slot slices of n_ctx/8 tokens) and with ``--kv-unified``, the one shared pool glmserve uses
(no fixed slices). Prints one table and the issue's targets, and writes them to
benchmarks/results/.

Build llama-server from the llama-cpp-python source package with the same CMake flags:

    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 && tar xzf llama_cpp_python-*.tar.gz
    cmake -S llama_cpp_python-*/vendor/llama.cpp -B build -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \\
        -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
    cmake --build build --target llama-server -j2

    python benchmarks/compare_llama_server.py --llama-server build/bin/llama-server
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import time
from pathlib import Path

import httpx

from glmserve.bench.metrics import Summary
from glmserve.bench.report import hardware
from glmserve.bench.runner import run_all
from glmserve.models import default_model_path
from glmserve.settings import BenchSettings
from glmserve.testing import RemoteServer, free_port

RESULTS = Path(__file__).parent / "results"


def run_levels(url: str, label: str, args) -> list[Summary]:
    out = []
    for c in args.concurrency:
        settings = BenchSettings(url=url, label=label, concurrency=[c], num_requests=max(8, 4 * c),
                                 input_len=args.input_len, output_len=args.output_len, ignore_eos=True)
        out += asyncio.run(run_all(settings))[1]
    return out


def bench_glmserve(args) -> list[Summary]:
    server = RemoteServer("--max-num-seqs", str(args.parallel), n_threads=args.threads)
    try:
        return run_levels(server.url, "glmserve", args)
    finally:
        server.stop()


def bench_llama_server(args, unified: bool) -> list[Summary]:
    port = free_port()
    cmd = [args.llama_server, "-m", str(default_model_path()), "--host", "127.0.0.1", "--port", str(port),
           "-t", str(args.threads), "-tb", str(args.threads), "-c", str(args.n_ctx), "-np", str(args.parallel),
           "--kv-unified" if unified else "--no-kv-unified"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        return run_levels(f"http://127.0.0.1:{port}", llama_server_label(args, unified), args)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def llama_server_label(args, unified: bool) -> str:
    return f"llama-server -np {args.parallel}" + (" --kv-unified" if unified else "")


def table(rows: dict[str, list[Summary]]) -> str:
    lines = ["| concurrency | system | ok/failed | output tok/s | req/s | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | ITL p50 ms |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    levels = sorted({s.concurrency for summaries in rows.values() for s in summaries})
    for c in levels:
        for name, summaries in rows.items():
            for s in (x for x in summaries if x.concurrency == c):
                lines.append(f"| {c} | {name} | {s.completed}/{s.failed} | {s.output_throughput:.1f} | "
                             f"{s.request_throughput:.2f} | {s.ttft_ms['p50']:.0f} | {s.ttft_ms['p99']:.0f} | "
                             f"{s.tpot_ms['p50']:.1f} | {s.itl_ms['p50']:.1f} |")
    return "\n".join(lines)


def targets(ours: list[Summary], theirs: list[Summary], same_kv: list[Summary]) -> list[str]:
    by = lambda xs, c: next((s for s in xs if s.concurrency == c), None)  # noqa: E731
    out = []
    o1, o8, t1, t8, u8 = by(ours, 1), by(ours, 8), by(theirs, 1), by(theirs, 8), by(same_kv, 8)
    if o1 and o8:
        out.append(f"- glmserve c=8 / c=1 throughput: {o8.output_throughput / o1.output_throughput:.2f}x (target >= 2x)")
    if o8 and t8:
        out.append(f"- c=8 throughput glmserve / llama-server: {o8.output_throughput / t8.output_throughput:.2f} (target >= 1)")
        out.append(f"- c=8 p50 TTFT: glmserve {o8.ttft_ms['p50']:.0f} ms, llama-server {t8.ttft_ms['p50']:.0f} ms "
                   "(target: no worse)")
    if o8 and u8:
        out.append(f"- c=8 throughput glmserve / llama-server --kv-unified (same KV cache model): "
                   f"{o8.output_throughput / u8.output_throughput:.2f}; p50 TTFT {o8.ttft_ms['p50']:.0f} vs "
                   f"{u8.ttft_ms['p50']:.0f} ms")
    if o1 and t1:
        out.append(f"- single-stream decode (1/TPOT p50): glmserve {1000 / o1.tpot_ms['p50']:.1f} tok/s, llama-server "
                   f"{1000 / t1.tpot_ms['p50']:.1f} tok/s, ratio {t1.tpot_ms['p50'] / o1.tpot_ms['p50']:.3f} "
                   "(target >= 0.95)")
    failed = sum(s.failed for s in ours)
    out.append(f"- failed glmserve requests over all levels: {failed} (target 0)")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-server", required=True, help="path to the llama-server binary")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=8, help="max_num_seqs / llama-server -np")
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4, 8, 16])
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=128)
    args = ap.parse_args()
    rows = {"glmserve": bench_glmserve(args),
            llama_server_label(args, False): bench_llama_server(args, unified=False),
            llama_server_label(args, True): bench_llama_server(args, unified=True)}
    ours, theirs, same_kv = rows.values()
    report = "\n".join([
        f"hardware: {hardware()} | model: SmolLM2-135M-Instruct Q4_1 (embedded default) | threads {args.threads} | "
        f"n_ctx {args.n_ctx} | {args.parallel} parallel sequences | input ~{args.input_len} tokens, output "
        f"{args.output_len} (ignore_eos, greedy) | requests per level: max(8, 4 x concurrency)",
        "", table(rows), "", *targets(list(ours), list(theirs), list(same_kv)),
    ])
    print(report)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "compare_llama_server.md").write_text(
        "# glmserve vs llama-server\n\n`python benchmarks/compare_llama_server.py --llama-server PATH`\n\n"
        + report + "\n")
    (RESULTS / "compare_llama_server.json").write_text(json.dumps(
        {name: [s.to_dict() for s in summaries] for name, summaries in rows.items()}, indent=2))


if __name__ == "__main__":
    main()
