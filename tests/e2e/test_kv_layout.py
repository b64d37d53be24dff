"""The llama_cpp engine's KV cache layouts (``--kv-layout``): every request may use the whole
context ``/v1/models`` advertises, whatever else runs; the layout and size are logged at start;
prefix reuse works across split streams (llama.cpp copies the stream)."""

from __future__ import annotations

import asyncio
import re

import openai
import pytest

from tests.conftest import DEFAULT_MODEL, RemoteServer

N_CTX = 512


@pytest.fixture(scope="module", params=["split", "unified"])
def server(request):
    # --batch-invariant: a shared prefix's cells must be those a request would compute alone
    srv = RemoteServer("--n-ctx", str(N_CTX), "--max-num-seqs", "2", "--kv-layout", request.param, "--batch-invariant")
    srv.layout = request.param
    yield srv
    srv.stop()


def test_start_up_logs_the_kv_cache_size(server):
    line = next(line for line in server.log().splitlines() if "KV cache (" in line)
    cells = int(re.search(r"(\d+) cells", line).group(1))
    mib = float(re.search(r"([\d.]+) MiB", line).group(1))
    assert f"({server.layout})" in line and f"n_ctx={N_CTX}" in line
    # SmolLM2-135M: 30 layers x 3 KV heads x 64 dims x (K and V) x 2 bytes = 22.5 KiB per cell
    assert cells == (2 * N_CTX if server.layout == "split" else N_CTX)
    assert mib == pytest.approx(cells * 23040 / 2**20, abs=0.1)


def test_two_requests_each_use_the_whole_advertised_context(server):
    client = server.client()
    assert client.models.retrieve(DEFAULT_MODEL).model_extra["max_model_len"] == N_CTX
    words = " ".join(["apple"] * 380)
    aclient = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=300)

    async def one(i: int):
        return await aclient.chat.completions.create(
            model=DEFAULT_MODEL, messages=[{"role": "user", "content": f"{i} {words}"}], temperature=0,
            extra_body={"ignore_eos": True})  # no max_tokens: up to the end of the context

    async def both():
        return await asyncio.gather(one(1), one(2))

    replies = asyncio.run(both())
    for reply in replies:
        # generation ran until the context was full: prompt + output = n_ctx, nothing truncated
        assert reply.choices[0].finish_reason == "length"
        assert reply.usage.prompt_tokens + reply.usage.completion_tokens == N_CTX
    if server.layout == "split":  # (unified: 2 x 512 tokens in 512 shared cells, so one waits)
        assert "preempted" not in server.log()


def test_a_shared_long_prefix_is_reused_from_a_running_sequence(server):
    """The second request arrives while the first (same long system prompt) still runs: its
    prefix comes from the first's cells (split: a stream copy), and greedy output is the same as
    when computed alone."""
    system = {"role": "system", "content": "You are a careful assistant. " * 30}
    messages = [system, {"role": "user", "content": "Name a colour."}]
    client = server.client()
    alone = client.chat.completions.create(model=DEFAULT_MODEL, messages=messages, temperature=0, max_tokens=16)
    aclient = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=300)

    async def run():
        # takes the slot that holds `alone`'s cache, and keeps running
        long = await aclient.chat.completions.create(
            model=DEFAULT_MODEL, messages=[system, {"role": "user", "content": "Count."}], temperature=0,
            max_tokens=200, stream=True, extra_body={"ignore_eos": True})
        chunks = aiter(long)
        await anext(chunks)
        await anext(chunks)  # its prompt is decoded: its cells can be shared
        again = await aclient.chat.completions.create(model=DEFAULT_MODEL, messages=messages, temperature=0,
                                                      max_tokens=16)
        async for _ in chunks:
            pass
        return again

    again = asyncio.run(run())
    assert again.choices[0].message.content == alone.choices[0].message.content
    assert again.usage.prompt_tokens_details.cached_tokens > 150
