"""Interactive requests while a batch runs: how much does a running ``/v1/batches`` job cost an
interactive request's time to first token (TTFT) and per output token (TPOT)?

One server (the embedded model by default, greedy). Each round measures ``--requests`` streamed
chat requests sent one after another (distinct prompts of about ``--input-len`` tokens,
``--output-len`` tokens each, ignore_eos) twice, in ABBA order: alone, and while a batch
of ``--batch-lines`` chat requests (``--batch-output-len`` tokens each) runs; the batch is
cancelled after each round. The batch runner fills the engine's whole batch while nothing else
runs and starts no new line while an interactive request is in flight; the engine pauses the
lines already running while an interactive request runs and for a second after it. The batch's
own rate (lines finished per second) is measured while it runs alone, for ``--batch-window``
seconds before each round's interactive requests, and while they run.

    python benchmarks/batch_priority.py [--rounds 6] [--requests 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time

import httpx
from rounds import check_rounds, order, paired, paired_text, save, stream_chat  # noqa: I001

from glmserve.bench.report import hardware
from glmserve.testing import RemoteServer

WORDS = ("river stone lantern orbit velvet harbor quartz meadow signal copper violet canyon ember "
         "glacier thistle beacon marble falcon willow prism").split()


def prompt(rng: random.Random, n_words: int) -> str:
    return "Summarise these words: " + " ".join(rng.choice(WORDS) for _ in range(n_words))


async def interactive(url: str, model: str, rng: random.Random, n: int, input_len: int,
                      output_len: int) -> list[dict]:
    out = []
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        for _ in range(n):
            body = {"model": model, "stream": True, "max_tokens": output_len, "ignore_eos": True,
                    "messages": [{"role": "user", "content": prompt(rng, input_len)}],
                    "stream_options": {"include_usage": True}}
            r = await stream_chat(client, body)
            tokens = r["usage"].get("completion_tokens", output_len)
            out.append({"ttft_ms": (r["first"] - r["start"]) * 1000,
                        "tpot_ms": (r["end"] - r["first"]) * 1000 / max(1, tokens - 1)})
    return out


def start_batch(client: httpx.Client, model: str, rng: random.Random, lines: int, input_len: int,
                output_len: int) -> str:
    rows = [{"custom_id": f"b{i}", "method": "POST", "url": "/v1/chat/completions",
             "body": {"model": model, "max_tokens": output_len, "ignore_eos": True,
                      "messages": [{"role": "user", "content": prompt(rng, input_len)}]}} for i in range(lines)]
    data = "\n".join(json.dumps(r) for r in rows).encode()
    file_id = client.post("/v1/files", files={"file": ("b.jsonl", data)}, data={"purpose": "batch"}).json()["id"]
    batch = client.post("/v1/batches", json={"input_file_id": file_id, "endpoint": "/v1/chat/completions",
                                             "completion_window": "24h"}).json()
    return batch["id"]


def completed(client: httpx.Client, batch_id: str) -> int:
    return client.get(f"/v1/batches/{batch_id}").json()["request_counts"]["completed"]


def running(client: httpx.Client) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("glmserve:num_requests_running"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=check_rounds, default=6, help="an even number (ABBA order)")
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--input-len", type=int, default=100, help="words in an interactive prompt (~2 tokens each)")
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--batch-lines", type=int, default=400)
    p.add_argument("--batch-output-len", type=int, default=64)
    p.add_argument("--max-num-seqs", type=int, default=8)
    p.add_argument("--batch-window", type=float, default=12.0,
                   help="seconds the batch runs alone, before the interactive requests, to measure its rate")
    args = p.parse_args()
    server = RemoteServer("--override-generation-config", '{"temperature": 0}', "--max-num-seqs",
                          str(args.max_num_seqs))
    rows: dict[str, list[dict]] = {"alone": [], "with a batch running": []}
    per_round: dict[str, list[float]] = {k: [] for k in rows}
    batch_rates: list[float] = []
    alone_rates: list[float] = []
    try:
        client = httpx.Client(base_url=server.url, timeout=600)
        model = client.get("/v1/models").json()["data"][0]["id"]
        asyncio.run(interactive(server.url, model, random.Random(-1), 2, args.input_len, args.output_len))  # warm
        for r in range(args.rounds):
            for name in order(list(rows), r):
                rng = random.Random(r * 10 + (name == "alone"))
                batch_id = None
                if name != "alone":
                    batch_id = start_batch(client, model, rng, args.batch_lines, args.input_len // 2,
                                           args.batch_output_len)
                    deadline = time.monotonic() + 120
                    while running(client) < args.max_num_seqs and time.monotonic() < deadline:
                        time.sleep(0.05)
                    began = time.monotonic()  # the batch alone for --batch-window seconds
                    done_before = completed(client, batch_id)
                    time.sleep(args.batch_window)
                    alone_rates.append((completed(client, batch_id) - done_before) / (time.monotonic() - began))
                    began = time.monotonic()
                    done_before = completed(client, batch_id)
                results = asyncio.run(interactive(server.url, model, rng, args.requests, args.input_len,
                                                  args.output_len))
                if batch_id is not None:
                    done = completed(client, batch_id)
                    batch_rates.append((done - done_before) / (time.monotonic() - began))
                    client.post(f"/v1/batches/{batch_id}/cancel")
                    while client.get(f"/v1/batches/{batch_id}").json()["status"] != "cancelled":
                        time.sleep(0.2)
                rows[name] += results
                per_round[name].append(statistics.median(x["ttft_ms"] for x in results))
                print(f"round {r + 1} {name}: TTFT p50 {per_round[name][-1]:.0f} ms", file=sys.stderr)
    finally:
        server.stop()
    lines = [f"{hardware()}; SmolLM2-135M-Instruct Q4_1 (llama_cpp, 2 threads, --max-num-seqs {args.max_num_seqs}); "
             f"interactive: {args.requests} requests one after another, ~{args.input_len * 2} prompt tokens, "
             f"{args.output_len} output tokens; batch: {args.batch_lines} lines of {args.batch_output_len} output "
             f"tokens; medians over {args.rounds} rounds in ABBA order; the ratio: the median of per-round ratios", "",
             "| interactive requests | TTFT p50 ms | TTFT p90 ms | TPOT p50 ms | TTFT p50 per round |",
             "|---|---:|---:|---:|---|"]
    stats = {}
    for name, results in rows.items():
        ttft = sorted(x["ttft_ms"] for x in results)
        stats[name] = {"ttft_p50_ms": statistics.median(ttft), "ttft_p90_ms": ttft[int(0.9 * (len(ttft) - 1))],
                       "tpot_p50_ms": statistics.median(x["tpot_ms"] for x in results),
                       "rounds": [round(x) for x in per_round[name]]}
        s = stats[name]
        lines.append(f"| {name} | {s['ttft_p50_ms']:.0f} | {s['ttft_p90_ms']:.0f} | {s['tpot_p50_ms']:.1f} | "
                     f"{s['rounds']} |")
    ratio = paired(per_round["with a batch running"], per_round["alone"])
    stats["ttft_ratio"] = ratio
    stats["batch_lines_per_s_during_interactive"] = statistics.median(batch_rates) if batch_rates else None
    stats["batch_lines_per_s_alone"] = statistics.median(alone_rates) if alone_rates else None
    lines += ["", f"TTFT p50 with a batch running / alone: {paired_text(ratio)}; batch lines finished per second: "
              f"{stats['batch_lines_per_s_alone']:.2f} alone ({args.batch_window:g} s before the interactive requests), "
              f"{stats['batch_lines_per_s_during_interactive']:.2f} while they ran (medians)"]
    save("batch_priority", "Interactive requests while a batch runs", "\n".join(lines), stats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
