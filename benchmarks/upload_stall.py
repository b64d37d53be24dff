"""Does a big upload stall the streams? The largest gap between two chunks of a streamed chat
completion, alone and while a client uploads a batch file of ``--upload-mib`` MiB and makes a
batch of it (the server reads, checks and stores the upload and parses the file in worker
threads, off the event loop that writes every stream's chunks).

One server (the embedded model, greedy, ``--max-request-bytes`` above the upload). Each round
streams ``--output-len`` tokens (ignore_eos) twice, in alternating order: alone, and with the
upload started at the stream's first chunk, from another process (``curl``, so that this one
times only the stream). The file's lines are requests for another endpoint,
so the batch fails after parsing every line, and no line runs beside the stream.

    python benchmarks/upload_stall.py [--rounds 5] [--upload-mib 64] [--n-threads 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from glmserve.bench.report import hardware
from glmserve.testing import RemoteServer
from rounds import save  # benchmarks/rounds.py


def batch_file(mib: int) -> bytes:
    """About ``mib`` MiB of JSONL request lines (~1.3 KB each) for /v1/completions."""
    line = {"method": "POST", "url": "/v1/completions", "body": {"model": "m", "prompt": "x" * 1200}}
    rows, size, i = [], 0, 0
    while size < mib << 20:
        row = json.dumps({"custom_id": f"r{i}", **line})
        rows.append(row)
        size, i = size + len(row) + 1, i + 1
    return "\n".join(rows).encode()


async def stream_gaps(client: httpx.AsyncClient, model: str, output_len: int, started: asyncio.Event) -> list[float]:
    """The gaps (ms) between consecutive chunks of one streamed completion."""
    body = {"model": model, "stream": True, "max_tokens": output_len, "ignore_eos": True, "temperature": 0,
            "messages": [{"role": "user", "content": "Tell me a long story about a lighthouse."}]}
    times = []
    async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        async for line in resp.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                times.append(time.perf_counter())
                started.set()
    return [(b - a) * 1000 for a, b in zip(times[1:], times[2:])]  # after the first content chunk


async def upload(url: str, path: str, started: asyncio.Event) -> float:
    """Upload the file at ``path`` and make a batch of it, from another process (curl), so that
    this process's loop times only the stream."""
    await started.wait()
    began = time.perf_counter()
    proc = await asyncio.create_subprocess_exec("curl", "-sS", "-F", f"file=@{path}", "-F", "purpose=batch",
                                                f"{url}/v1/files", stdout=subprocess.PIPE)
    file = json.loads((await proc.communicate())[0])
    proc = await asyncio.create_subprocess_exec(
        "curl", "-sS", "-H", "content-type: application/json", "-d",
        json.dumps({"input_file_id": file["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}),
        f"{url}/v1/batches", stdout=subprocess.PIPE)
    batch = json.loads((await proc.communicate())[0])
    assert batch["status"] == "failed", batch
    return time.perf_counter() - began


async def one(url: str, model: str, output_len: int, path: str | None) -> tuple[float, float | None]:
    started = asyncio.Event()
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        jobs = [stream_gaps(client, model, output_len, started)]
        if path is not None:
            jobs.append(upload(url, path, started))
        results = await asyncio.gather(*jobs)
    return max(results[0]), (results[1] if path is not None else None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--upload-mib", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=200)
    parser.add_argument("--n-threads", type=int, default=2, help="the engine's threads (2: every core here)")
    args = parser.parse_args()
    content = batch_file(args.upload_mib)
    path = Path(tempfile.mkdtemp(prefix="glmserve-upload-")) / "big.jsonl"
    path.write_bytes(content)
    server = RemoteServer("--max-request-bytes", str(len(content) + (1 << 20)), n_threads=args.n_threads)
    modes = {"alone": None, f"during a {args.upload_mib} MiB upload and batch parse": str(path)}
    gaps: dict[str, list[float]] = {name: [] for name in modes}
    uploads: list[float] = []
    try:
        model = httpx.get(f"{server.url}/v1/models").json()["data"][0]["id"]
        for r in range(args.rounds):
            names = list(modes) if r % 2 == 0 else list(reversed(modes))
            for name in names:
                worst, took = asyncio.run(one(server.url, model, args.output_len, modes[name]))
                gaps[name].append(worst)
                if took is not None:
                    uploads.append(took)
                print(f"round {r + 1} {name}: largest chunk gap {worst:.0f} ms", file=sys.stderr)
    finally:
        server.stop()
        shutil.rmtree(path.parent, ignore_errors=True)
    lines = [f"{hardware()}; SmolLM2-135M-Instruct Q4_1 (llama_cpp, {args.n_threads} threads); one stream of {args.output_len} "
             f"tokens; medians over {args.rounds} alternating rounds", "",
             "| stream | largest gap between chunks, ms (median) | per round |", "|---|---:|---|"]
    stats = {}
    for name, values in gaps.items():
        stats[name] = {"max_gap_ms": statistics.median(values), "rounds": [round(v) for v in values]}
        lines.append(f"| {name} | {stats[name]['max_gap_ms']:.0f} | {stats[name]['rounds']} |")
    stats["upload_and_parse_s"] = statistics.median(uploads)
    lines += ["", f"upload, store and parse of the {len(content) >> 20} MiB file: {stats['upload_and_parse_s']:.1f} s "
              "(median)"]
    name = "upload_stall" if args.n_threads == 2 else f"upload_stall_{args.n_threads}_threads"
    save(name, "Streams during a big upload", "\n".join(lines), stats,
         command=" ".join(["python benchmarks/upload_stall.py", *sys.argv[1:]]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
