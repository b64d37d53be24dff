"""Continuous batching end to end: batching must not change results; aborts free sequences;
overload is a 429 with Retry-After, never a hang."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest

from tests.conftest import DEFAULT_MODEL, RemoteServer

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about autumn.",
    "List three fruits.",
    "Explain what a CPU does in one sentence.",
    "Tell me a joke about cats.",
    "What is 2 + 2?",
    "Name a famous painter.",
    "Describe the ocean in a few words.",
]


def _messages(prompt: str) -> list[dict]:
    return [{"role": "system", "content": "You are a helpful AI assistant."}, {"role": "user", "content": prompt}]


async def _stream(client: openai.AsyncOpenAI, prompt: str, max_tokens: int = 48) -> tuple[str, int]:
    stream = await client.chat.completions.create(
        model=DEFAULT_MODEL, messages=_messages(prompt), temperature=0, max_tokens=max_tokens, stream=True,
        stream_options={"include_usage": True})
    text, usage = [], None
    async for chunk in stream:
        if chunk.choices:
            text.append(chunk.choices[0].delta.content or "")
        if chunk.usage:
            usage = chunk.usage
    return "".join(text), usage.completion_tokens


def test_concurrent_greedy_streams_equal_sequential(server):
    client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=300)

    async def run():
        sequential = [await _stream(client, p) for p in PROMPTS]
        concurrent = await asyncio.gather(*(_stream(client, p) for p in PROMPTS))
        return sequential, concurrent

    sequential, concurrent = asyncio.run(run())
    assert all(text for text, _ in sequential)
    assert concurrent == sequential
