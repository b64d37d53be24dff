"""Drive one or more concurrency levels against a server and collect per-request results."""

from __future__ import annotations

import asyncio
import random
import time

import httpx
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from glmserve.bench.client import chat_body, make_prompt, stream_chat
from glmserve.bench.metrics import RequestResult, Summary, summarize
from glmserve.settings.bench import BenchSettings


class BenchError(RuntimeError):
    """The benchmark cannot run (server unreachable, no model); one line for the user."""


def api_base(url: str) -> str:
    """``http://host:port`` or ``.../v1`` -> ``http://host:port/v1/``."""
    base = url.rstrip("/")
    return (base if base.endswith("/v1") else base + "/v1") + "/"


def _client(settings: BenchSettings, max_connections: int) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
    return httpx.AsyncClient(
        base_url=api_base(settings.url), headers=headers, timeout=settings.timeout,
        limits=httpx.Limits(max_connections=max_connections + 2, max_keepalive_connections=max_connections + 2),
    )


async def resolve_model(settings: BenchSettings) -> str:
    if settings.model:
        return settings.model
    async with _client(settings, 1) as http:
        try:
            resp = await http.get("models")
            resp.raise_for_status()
            return resp.json()["data"][0]["id"]
        except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
            raise BenchError(f"cannot list models at {api_base(settings.url)}: {exc}") from exc


async def run_level(settings: BenchSettings, model: str, concurrency: int, progress: Progress) -> Summary:
    # prompts differ between levels and from the warm-up, so that no level hits prompts another
    # one left in a server's prefix cache
    rng = random.Random(f"{settings.seed}-{concurrency}")
    warmup_prompt = make_prompt(settings.input_len, random.Random(f"{settings.seed}-warmup-{concurrency}"))
    prompts = [make_prompt(settings.input_len, rng) for _ in range(settings.num_requests)]
    limit = asyncio.Semaphore(concurrency)
    task = progress.add_task(f"concurrency {concurrency}", total=settings.num_requests)

    async with _client(settings, concurrency) as http:
        def body(prompt: str) -> dict:
            return chat_body(model, prompt, settings.output_len, settings.ignore_eos, settings.temperature)

        warmup = await stream_chat(http, body(warmup_prompt))
        if not warmup.ok:
            raise BenchError(f"warm-up request failed: {warmup.error}")

        async def one(prompt: str) -> RequestResult:
            async with limit:
                result = await stream_chat(http, body(prompt))
            progress.advance(task)
            return result

        start = time.perf_counter()
        pending = []
        for prompt in prompts:
            pending.append(asyncio.create_task(one(prompt)))
            if settings.request_rate != float("inf"):
                await asyncio.sleep(rng.expovariate(settings.request_rate))
        results = await asyncio.gather(*pending)
        duration = time.perf_counter() - start
    return summarize(list(results), duration, concurrency)


async def run_all(settings: BenchSettings) -> tuple[str, list[Summary]]:
    model = await resolve_model(settings)
    summaries = []
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  transient=False) as progress:
        for concurrency in settings.concurrency:
            summaries.append(await run_level(settings, model, concurrency, progress))
    return model, summaries
