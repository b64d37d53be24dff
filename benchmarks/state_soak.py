"""A soak of the durable state under pressure: stored responses, conversations, uploads and
batches from four API keys against a small ``--store-max-bytes``, through two servers that
share one state database, on SQLite and on PostgreSQL.

Three keys hammer the store (each past its share soon: stored responses padded with 8 KB of
``metadata``, conversations of 20 items of 2 KB, uploads of 0.5-2 MiB, small batches), and
clean up as a user would when a write answers ``store_full`` (their oldest file or
conversation deleted). The fourth key stores a few responses, a file and a conversation at
the start, within its share, and reads them back every 20 seconds. Checked, and reported:

- no answer of 500 or more, from any route;
- the quiet key's objects all there at every check (no key loses data to another while
  within its share);
- from the database every 5 seconds: each key's stored bytes against its share and the
  total against the bound (``store_usage``), and at the end that the running totals agree
  with the tables;
- every batch ended, each of its lines answered once (its output and error files hold each
  ``custom_id`` once: a line not run when its batch stopped for room answers ``store_full``).

    python benchmarks/state_soak.py [--minutes 30] [--backends sqlite,postgresql]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import hashlib
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import httpx
import sqlalchemy as sa
from rounds import save  # noqa: I001

from glmserve.bench.report import hardware
from glmserve.testing import RemoteServer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.postgres, tests.state_checks

KEYS = ["soak-key-a", "soak-key-b", "soak-key-c", "soak-key-quiet"]
PAD = "x" * 500


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class Soak:
    def __init__(self, urls: list[str], model: str, database_url: str, bound: int, minutes: float) -> None:
        self.urls, self.model, self.bound, self.minutes = urls, model, bound, minutes
        self.share = bound // len(KEYS)
        self.database = sa.create_engine(database_url.replace("postgresql://", "postgresql+psycopg://", 1))
        self.statuses: collections.Counter = collections.Counter()
        self.server_errors: list[str] = []
        self.quiet_missing: list[str] = []
        self.usage_peak = {key: 0 for key in KEYS}
        self.total_peak = 0
        self.batches: list[tuple[str, str, int]] = []  # (key, batch id, lines)
        self.ops: collections.Counter = collections.Counter()

    def client(self, key: str) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=random.choice(self.urls), timeout=600,
                                 headers={"Authorization": f"Bearer {key}"})

    async def call(self, key: str, method: str, path: str, **kw) -> httpx.Response:
        async with self.client(key) as client:
            reply = await client.request(method, path, **kw)
        self.statuses[reply.status_code] += 1
        if reply.status_code >= 500:
            self.server_errors.append(f"{method} {path}: {reply.status_code} {reply.text[:200]}")
        return reply

    async def respond(self, key: str) -> httpx.Response:
        metadata = {f"k{i}": PAD for i in range(16)}
        return await self.call(key, "POST", "/v1/responses", json={
            "model": self.model, "input": f"Say {random.randint(0, 99)}.", "max_output_tokens": 2,
            "metadata": metadata})

    async def upload(self, key: str, lines: list[dict]) -> httpx.Response:
        data = "\n".join(json.dumps(line) for line in lines).encode()
        return await self.call(key, "POST", "/v1/files", files={"file": ("soak.jsonl", data)},
                               data={"purpose": "batch"})

    def filler(self, size: int) -> list[dict]:
        line = {"custom_id": "", "method": "POST", "url": "/v1/chat/completions",
                "body": {"model": self.model, "messages": [{"role": "user", "content": "y" * 1000}]}}
        return [{**line, "custom_id": f"f{i}"} for i in range(size // 1100)]

    async def hammer(self, key: str, deadline: float) -> None:
        files: list[str] = []
        conversations: list[str] = []
        while time.monotonic() < deadline:
            op = random.choices(["response", "conversation", "upload", "batch", "items"], [6, 2, 2, 1, 2])[0]
            self.ops[op] += 1
            if op == "response":
                reply = await self.respond(key)
            elif op == "conversation":
                items = [{"type": "message", "role": "user", "content": "z" * 2000} for _ in range(20)]
                reply = await self.call(key, "POST", "/v1/conversations", json={"items": items})
                if reply.status_code == 200:
                    conversations.append(reply.json()["id"])
            elif op == "items" and conversations:
                items = [{"type": "message", "role": "user", "content": "w" * 2000} for _ in range(5)]
                reply = await self.call(key, "POST", f"/v1/conversations/{random.choice(conversations)}/items",
                                        json={"items": items})
            elif op == "upload":
                reply = await self.upload(key, self.filler(random.randint(512 << 10, 2 << 20)))
                if reply.status_code == 200:
                    files.append(reply.json()["id"])
            else:
                n = random.randint(2, 6)
                lines = [{"custom_id": f"b{i}", "method": "POST", "url": "/v1/chat/completions",
                          "body": {"model": self.model, "max_tokens": 2,
                                   "messages": [{"role": "user", "content": f"Say {i}."}]}} for i in range(n)]
                reply = await self.upload(key, lines)
                if reply.status_code == 200:
                    file_id = reply.json()["id"]
                    reply = await self.call(key, "POST", "/v1/batches", json={
                        "input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"})
                    if reply.status_code == 200:
                        self.batches.append((key, reply.json()["id"], n))
            if reply.status_code == 400 and "store_full" in reply.text:  # make room as a user would
                if files:
                    await self.call(key, "DELETE", f"/v1/files/{files.pop(0)}")
                elif conversations:
                    await self.call(key, "DELETE", f"/v1/conversations/{conversations.pop(0)}")

    async def quiet(self, deadline: float) -> None:
        key = KEYS[-1]
        responses = [(await self.respond(key)).json()["id"] for _ in range(10)]
        file_id = (await self.upload(key, self.filler(1 << 20))).json()["id"]
        items = [{"type": "message", "role": "user", "content": "q" * 2000} for _ in range(10)]
        conversation = (await self.call(key, "POST", "/v1/conversations", json={"items": items})).json()["id"]
        paths = [f"/v1/responses/{rid}" for rid in responses] + [f"/v1/files/{file_id}",
                                                                 f"/v1/conversations/{conversation}"]
        while True:
            for path in paths:
                if (await self.call(key, "GET", path)).status_code != 200:
                    self.quiet_missing.append(path)
            if time.monotonic() >= deadline:
                return
            await asyncio.sleep(20)

    def sample(self) -> None:
        with self.database.connect() as conn:
            rows = dict(conn.execute(sa.text("SELECT owner, bytes FROM store_usage")).all())
        self.total_peak = max(self.total_peak, int(rows.get("*", 0)))
        for key in KEYS:
            self.usage_peak[key] = max(self.usage_peak[key], int(rows.get(digest(key), 0)))

    async def sampler(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            await asyncio.to_thread(self.sample)
            await asyncio.sleep(5)

    async def run(self) -> None:
        deadline = time.monotonic() + self.minutes * 60
        workers = [self.hammer(key, deadline) for key in KEYS[:-1] for _ in range(2)]
        await asyncio.gather(self.quiet(deadline), self.sampler(deadline), *workers)

    async def batch_lines(self) -> tuple[int, int, int, collections.Counter]:
        """Waits for every batch to end; ``(lines, answered, answered twice, statuses)``."""
        lines = answered = twice = 0
        ends: collections.Counter = collections.Counter()
        for key, batch_id, n in self.batches:
            for _ in range(600):
                body = (await self.call(key, "GET", f"/v1/batches/{batch_id}")).json()
                if body["status"] in ("completed", "failed", "cancelled", "expired"):
                    break
                await asyncio.sleep(1)
            ends[body["status"]] += 1
            seen: collections.Counter = collections.Counter()
            for file_key in ("output_file_id", "error_file_id"):
                if body.get(file_key):
                    text = (await self.call(key, "GET", f"/v1/files/{body[file_key]}/content")).text
                    seen.update(json.loads(line)["custom_id"] for line in text.splitlines() if line)
            lines += n
            answered += len(seen)
            twice += sum(1 for c in seen.values() if c > 1)
            if body["status"] == "completed" and len(seen) != n:
                self.server_errors.append(f"batch {batch_id}: {len(seen)} of {n} lines in its files")
        return lines, answered, twice, ends


def soak(backend: str, minutes: float, bound: int, model_args: list[str]) -> dict:
    from tests.postgres import PostgresServer
    from tests.state_checks import usage_agrees

    postgres = PostgresServer() if backend == "postgresql" else None
    state_dir = tempfile.mkdtemp(prefix="glmserve-soak-")
    env = {"GLMSERVE_STATE_DIR": state_dir}
    if postgres is not None:
        env["GLMSERVE_DATABASE_URL"] = postgres.url
    database_url = postgres.url if postgres else f"sqlite:///{state_dir}/state.db"
    keys = [arg for key in KEYS for arg in ("--api-key", key)]
    args = [*model_args, *keys, "--store-max-bytes", str(bound), "--n-threads", "1"]
    servers = [RemoteServer(*args, env=env, n_threads=None) for _ in range(2)]
    try:
        model = httpx.get(f"{servers[0].url}/v1/models", headers={"Authorization": f"Bearer {KEYS[0]}"}).json()[
            "data"][0]["id"]
        run = Soak([s.url for s in servers], model, database_url, bound, minutes)
        started = time.monotonic()
        asyncio.run(run.run())
        lines, answered, twice, ends = asyncio.run(run.batch_lines())
        elapsed = time.monotonic() - started
        run.sample()
        agrees = True
        try:
            usage_agrees(run.database)
        except AssertionError as exc:
            agrees = False
            run.server_errors.append(f"store_usage disagrees with the tables: {exc}")
        return {"backend": backend, "minutes": round(elapsed / 60, 1), "requests": sum(run.statuses.values()),
                "statuses": dict(run.statuses), "ops": dict(run.ops), "server_errors": run.server_errors[:20],
                "n_server_errors": len(run.server_errors), "quiet_missing": run.quiet_missing,
                "share": run.share, "bound": bound, "total_peak": run.total_peak,
                "usage_peak": {k: run.usage_peak[k] for k in KEYS}, "batches": len(run.batches),
                "batch_ends": dict(ends), "lines": lines, "answered": answered, "answered_twice": twice,
                "usage_agrees": agrees}
    finally:
        for server in servers:
            server.stop()
        if postgres is not None:
            postgres.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--store-max-bytes", type=int, default=64 << 20)
    parser.add_argument("--model-args", default="", help="serve flags for the model (default: the embedded one)")
    args = parser.parse_args()
    results = [soak(b, args.minutes, args.store_max_bytes, args.model_args.split()) for b in args.backends.split(",")]
    mib = 1 << 20
    rows = ["| backend | minutes | requests | 5xx | store_full | quiet key's objects lost | peak key / share (MiB) "
            "| peak total / bound (MiB) | batches (ends) | lines answered / twice | totals agree |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        fives = sum(n for s, n in r["statuses"].items() if int(s) >= 500)
        full = r["statuses"].get(400, 0)
        peaks = " ".join(f"{v / mib:.1f}" for v in r["usage_peak"].values())
        rows.append(f"| {r['backend']} | {r['minutes']} | {r['requests']} | {fives} | {full} (400s) | "
                    f"{len(r['quiet_missing'])} | {peaks} / {r['share'] / mib:.1f} | "
                    f"{r['total_peak'] / mib:.1f} / {r['bound'] / mib:.1f} | {r['batches']} {r['batch_ends']} | "
                    f"{r['answered']} of {r['lines']} / {r['answered_twice']} | {r['usage_agrees']} |")
    report = (f"{hardware()}; the embedded model unless --model-args; two servers on one state database; "
              f"keys: {len(KEYS)} (3 hammering, 1 quiet)\n\n" + "\n".join(rows))
    for r in results:
        if r["server_errors"]:
            report += f"\n\n{r['backend']}: " + "; ".join(r["server_errors"])
    save("state_soak", "Durable state under pressure: a soak", report, {"results": results},
         f"python benchmarks/state_soak.py --minutes {args.minutes:g} --backends {args.backends}")


if __name__ == "__main__":
    main()
