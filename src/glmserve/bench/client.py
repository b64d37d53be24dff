"""One streamed chat completion against any OpenAI-compatible server, timed per chunk."""

from __future__ import annotations

import json
import random
import time

import httpx

from glmserve.bench.metrics import RequestResult

# Common short English words: each is one token in most BPE vocabularies, so N words make a
# prompt of about N tokens (the report shows the server's own count).
WORDS = (
    "time year people way day man thing woman life child world school state family student group "
    "country problem hand part place case week company system program question work government "
    "number night point home water room mother area money story fact month lot right study book "
    "eye job word business issue side kind head house service friend father power hour game line"
).split()


def make_prompt(n_tokens: int, rng: random.Random) -> str:
    return "Repeat these words: " + " ".join(rng.choice(WORDS) for _ in range(max(1, n_tokens - 4)))


def chat_body(model: str, prompt: str, output_len: int, ignore_eos: bool, temperature: float) -> dict:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": output_len,
        "temperature": temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if ignore_eos:
        body["ignore_eos"] = True
    return body


async def stream_chat(http: httpx.AsyncClient, body: dict) -> RequestResult:
    """Send ``body`` (``stream: true``) to ``/chat/completions`` and time it. Never raises:
    failures come back with ``ok=False`` and the reason."""
    start = time.perf_counter()
    first = last = 0.0
    chunks = 0
    itl: list[float] = []
    usage: dict | None = None
    try:
        async with http.stream("POST", "chat/completions", json=body) as resp:
            if resp.status_code != 200:
                await resp.aread()
                return RequestResult(False, error=f"HTTP {resp.status_code}: {resp.text[:500]}")
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                event = json.loads(data)
                if "error" in event:
                    return RequestResult(False, error=str(event["error"])[:200])
                if event.get("usage"):
                    usage = event["usage"]
                for choice in event.get("choices") or []:
                    if (choice.get("delta") or {}).get("content"):
                        now = time.perf_counter()
                        if chunks == 0:
                            first = now
                        else:
                            itl.append(now - last)
                        last = now
                        chunks += 1
    except (httpx.HTTPError, ValueError) as exc:
        return RequestResult(False, error=f"{type(exc).__name__}: {exc}"[:200])
    end = time.perf_counter()
    if chunks == 0:
        return RequestResult(False, error="no content tokens in the stream")
    output_tokens = usage.get("completion_tokens", chunks) if usage else chunks
    prompt_tokens = usage.get("prompt_tokens", 0) if usage else 0
    return RequestResult(True, prompt_tokens, output_tokens, first - start, end - start, itl)
