"""Stress a server of several models: two models and the ``--model`` model under
``--max-loaded-models 1``, with a LoRA adapter loaded at run time (``--max-loras 1``), while
concurrent streamed requests (some cut by the client after a few chunks, some plain) go to all
of them and the models are unloaded by hand (``POST /models/unload``) in the middle of it, over
several rounds. Each model's load evicts another, so every round loads and unloads engines
many times while requests wait for room. After each round every model is unloaded and the
server's memory read, so each reading is of the same state (no engine loaded).

Passes when no request gets a 5xx (a 503 ``model_busy`` counts too) and the server's anonymous
memory (``RssAnon``: heap and engine buffers, without the mapped model files) is flat over the
second half of the rounds: the last round's within ``--max-growth-mib`` of the middle one's
(the first rounds warm the allocator up: glibc adds an arena per new engine thread, up to 8 per
core, and then reuses them).
The host prompt cache is off (``--cache-ram 0``): it holds up to 2 GiB by design, which would
hide a leak. The table: per round, requests, answered,
cut on purpose, 4xx, 5xx, unloads by hand, and the server's memory after the round.

    python benchmarks/many_models_stress.py [--rounds 8] [--concurrency 6] [--requests 24]

Needs the test extras (peft, to build the GGUF LoRA adapter as the tests do).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
from pathlib import Path

import httpx

from rounds import memory_mib, save  # benchmarks/rounds.py

from glmserve.bench.report import hardware
from glmserve.models import default_model_path
from glmserve.testing import RemoteServer

QUESTIONS = ["What is the capital of France?", "Name a famous painter.", "List three fruits.", "What is 2 + 2?"]


async def one_request(client: httpx.AsyncClient, model: str, cut: bool, rng: random.Random) -> int:
    """A streamed chat request; ``cut``: the client leaves after 3 chunks. The HTTP status."""
    body = {"model": model, "messages": [{"role": "user", "content": rng.choice(QUESTIONS)}],
            "max_tokens": rng.choice((8, 24, 48)), "temperature": 0.7, "stream": True}
    async with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        if resp.status_code != 200:
            await resp.aread()
            return resp.status_code
        chunks = 0
        async for line in resp.aiter_lines():
            chunks += line.startswith("data: ")
            if cut and chunks >= 3:
                break  # leaving the block closes the connection mid-stream
    return 200


async def one_round(url: str, models: list[str], requests: int, concurrency: int, seed: int) -> dict:
    rng = random.Random(seed)
    counts = {"requests": requests, "ok": 0, "cut": 0, "4xx": 0, "5xx": 0, "unloads": 0}
    limit = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        async def request() -> None:
            cut = rng.random() < 0.3
            async with limit:
                status = await one_request(client, rng.choice(models), cut, rng)
            counts["ok" if status == 200 else "4xx" if status < 500 else "5xx"] += 1
            counts["cut"] += cut and status == 200

        async def unloads() -> None:
            for _ in range(3):
                await asyncio.sleep(rng.uniform(0.2, 1.5))
                resp = await client.post("/models/unload", json={"model": rng.choice(models[1:3])})
                counts["unloads"] += 1
                counts["5xx"] += resp.status_code >= 500

        await asyncio.gather(unloads(), *(request() for _ in range(requests)))
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--requests", type=int, default=24, help="requests per round")
    parser.add_argument("--concurrency", type=int, default=6)
    parser.add_argument("--max-growth-mib", type=float, default=16.0)
    args = parser.parse_args()

    sys.path.insert(0, str(Path(__file__).parent.parent))
    from tests.hf_models import gguf_lora, lora_adapter, smollm2_folder

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        models_dir = root / "models"
        models_dir.mkdir()
        for name in ("alpha", "beta"):
            (models_dir / f"{name}.gguf").symlink_to(default_model_path())
        adapter = gguf_lora(lora_adapter(smollm2_folder(root / "hf"), root / "adapter", scale=0.05,
                                         target_modules=("v_proj", "o_proj")), root / "tuned.gguf")
        server = RemoteServer("--models-dir", str(models_dir), "--max-loaded-models", "1", "--max-loras", "1",
                              "--allow-runtime-lora-updating", "--n-ctx", "1024", "--max-num-seqs", "4",
                              # the host prompt cache (up to --cache-ram MiB by design) would hide a leak
                              "--cache-ram", "0")
        try:
            base = server.client().models.list().data[0].id
            loaded = httpx.post(f"{server.url}/v1/load_lora_adapter", timeout=120,
                                json={"lora_name": "tuned", "lora_path": str(adapter)})
            assert loaded.status_code == 200, loaded.text
            models = [base, "alpha", "beta", "tuned"]
            rows, stats = [], []
            for i in range(args.rounds):
                counts = asyncio.run(one_round(server.url, models, args.requests, args.concurrency, seed=i))
                for name in models[:3]:  # measured with no engine loaded, the same state each round
                    resp = httpx.post(f"{server.url}/models/unload", json={"model": name}, timeout=120)
                    counts["5xx"] += resp.status_code >= 500
                rss, anon = memory_mib(server.proc.pid)
                counts.update(round=i + 1, vm_rss_mib=round(rss, 1), rss_anon_mib=round(anon, 1))
                stats.append(counts)
                rows.append(f"| {i + 1} | {counts['requests']} | {counts['ok']} | {counts['cut']} | {counts['4xx']} | "
                            f"{counts['5xx']} | {counts['unloads']} | {rss:.0f} | {anon:.0f} |")
                print(rows[-1], flush=True)
        finally:
            server.stop()
    middle = len(stats) // 2
    growth = stats[-1]["rss_anon_mib"] - stats[middle]["rss_anon_mib"]
    failures = sum(s["5xx"] for s in stats)
    report = "\n".join([
        f"hardware: {hardware()}",
        f"model: the embedded default (as {', '.join(models[:3])}) + LoRA adapter 'tuned' (--max-loras 1); "
        f"--max-loaded-models 1; {args.rounds} rounds of {args.requests} streamed requests at concurrency "
        f"{args.concurrency}, 30% cut after 3 chunks, 3 unloads by hand a round",
        "",
        "| round | requests | answered | cut | 4xx | 5xx | unloads | VmRSS MiB | RssAnon MiB |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"5xx: {failures}; RssAnon growth round {middle + 1} -> last round: {growth:+.1f} MiB (median "
        f"{statistics.median(s['rss_anon_mib'] for s in stats):.0f} MiB)",
    ])
    save("many_models_stress", "Many models under stress", report, {"rounds": stats, "growth_mib": growth})
    return 0 if failures == 0 and growth <= args.max_growth_mib else 1


if __name__ == "__main__":
    sys.exit(main())
