"""The host-memory prompt cache (``--cache-ram``) end to end on the embedded model: a sequence
state saved when its cells go to another request and restored for a later prompt gives the
greedy answer of the state it replaced (of a cold run, in batch-invariant mode); the cache stays
within its bound; concurrent requests that restore and evict states get their own answers."""

from __future__ import annotations

import asyncio
import random
import re

import httpx
import openai
import pytest

from tests.conftest import DEFAULT_MODEL, RemoteServer

COLOURS = ("red", "blue", "green", "yellow", "black")


def _doc(seed: int, items: int) -> list[dict]:
    """A prompt of about 10 x ``items`` + 30 tokens (20 items: 210, 100: 930) that shares only the
    chat template's opening with any other seed's."""
    rng = random.Random(seed)
    listing = " ".join(f"Item {i} is a {rng.choice(COLOURS)} box." for i in range(items))
    return [{"role": "user", "content": f"List {seed}. {listing}\nRepeat the list."}]


OTHER = [{"role": "user", "content": "Write a haiku about the sea."}]


def _ask(client: openai.OpenAI, messages: list[dict], max_tokens: int = 16):
    reply = client.chat.completions.create(model=DEFAULT_MODEL, messages=messages, temperature=0,
                                           max_tokens=max_tokens)
    return reply.choices[0].message.content, reply.usage.prompt_tokens, reply.usage.prompt_tokens_details.cached_tokens


def _metrics(server: RemoteServer) -> dict[str, float]:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    return {m[1]: float(m[2]) for m in re.finditer(r"^(glmserve:prompt_cache_ram_\w+)\{[^}]*\} (\S+)$", text, re.M)}


@pytest.fixture(scope="module")
def one_seq():
    """One sequence: every new prompt takes the cells of the last one."""
    srv = RemoteServer("--max-num-seqs", "1", "--cache-ram", "64")
    yield srv
    srv.stop()


def test_a_restored_state_answers_as_the_sequence_it_replaced(one_seq):
    client, doc = one_seq.client(), _doc(1, 40)
    cold, n, _ = _ask(client, doc)
    warm, _, cached_warm = _ask(client, doc)  # from the sequence's own cells
    assert n > 300 and cached_warm == n - 1
    before = _metrics(one_seq)
    _ask(client, OTHER, 4)  # takes the only sequence: the document's state goes to host memory
    saved = _metrics(one_seq)
    assert saved["glmserve:prompt_cache_ram_entries"] >= 1
    assert saved["glmserve:prompt_cache_ram_bytes"] > before.get("glmserve:prompt_cache_ram_bytes", 0)
    restored, _, cached = _ask(client, doc)
    assert cached == n - 1, "the prompt was computed again instead of restored"
    assert _metrics(one_seq)["glmserve:prompt_cache_ram_restores_total"] == before.get(
        "glmserve:prompt_cache_ram_restores_total", 0) + 1
    # the last prompt token is computed alone in both: the restored cells equal the slot's own
    assert restored == warm
    assert cold  # (the cold run computed its last token among the prompt's; it may round otherwise)


def test_without_the_cache_the_prompt_is_computed_again():
    srv = RemoteServer("--max-num-seqs", "1", "--cache-ram", "0")
    try:
        client, doc = srv.client(), _doc(2, 40)
        _, n, _ = _ask(client, doc)
        _ask(client, OTHER, 4)
        _, _, cached = _ask(client, doc)
        assert cached < 50  # the chat template's opening only
        assert _metrics(srv) == {}
    finally:
        srv.stop()


def test_the_cache_stays_within_its_bound(one_seq):
    """64 MiB holds about 2,900 tokens of SmolLM2's KV (22.5 KiB each): documents of about 930
    tokens rotate through it, the least recently used going first."""
    client = one_seq.client()
    bound = 64 * 2**20
    docs = [_doc(10 + i, 100) for i in range(6)]
    for doc in docs:
        _ask(client, doc, 4)
        m = _metrics(one_seq)
        assert 0 < m["glmserve:prompt_cache_ram_bytes"] <= bound
    assert m["glmserve:prompt_cache_ram_entries"] < len(docs) - 1  # some were evicted
    _, n, cached = _ask(client, docs[-2], 4)  # the most recently saved one is still there
    assert cached == n - 1
    _, n, cached = _ask(client, docs[0], 4)  # the oldest is gone
    assert cached < 50


def test_concurrent_restores_and_evictions_give_each_request_its_own_answer():
    """Batch-invariant mode and prompts under 256 tokens: every greedy answer is bit-identical
    whether computed cold, restored or batched (see the README), so any mix-up of states shows."""
    srv = RemoteServer("--max-num-seqs", "2", "--cache-ram", "64", "--batch-invariant")
    try:
        client = srv.client()
        docs = [_doc(100 + i, 20) for i in range(6)]
        cold = [_ask(client, doc)[0] for doc in docs]
        assert len(set(cold)) > 1
        aclient = openai.AsyncOpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0, timeout=300)

        async def ask(doc):
            reply = await aclient.chat.completions.create(model=DEFAULT_MODEL, messages=doc, temperature=0,
                                                          max_tokens=16)
            return reply.choices[0].message.content, reply.usage.prompt_tokens_details.cached_tokens

        async def rounds():
            results = []
            for r in range(3):
                order = random.Random(r).sample(range(len(docs)), len(docs))
                got = await asyncio.gather(*(ask(docs[i]) for i in order))
                results.extend(zip(order, got))
            return results

        results = asyncio.run(rounds())
        for i, (text, _) in results:
            assert text == cold[i], f"document {i}"
        assert sum(cached > 100 for _, (_, cached) in results) >= len(docs)  # most came from a cache
        assert _metrics(srv)["glmserve:prompt_cache_ram_restores_total"] >= 1
        assert httpx.get(f"{srv.url}/health", timeout=10).status_code == 200
    finally:
        srv.stop()


def test_cache_ram_needs_the_split_layout():
    with pytest.raises(RuntimeError, match="--cache-ram needs --kv-layout split"):
        RemoteServer("--kv-layout", "unified", "--cache-ram", "64")


def test_one_keys_prompts_are_not_cached_for_another():
    """A server of several keys caches each key's prompts apart: key B's ``cached_tokens`` for
    a prefix key A sent is 0 (it cannot learn what A sent), while A's own repeat reuses it; a
    client's ``cache_salt`` (vLLM's field) keeps prompts apart the same way within one key."""
    server = RemoteServer("--api-key", "key-a", "--api-key", "key-b")
    try:
        a, b = server.client(api_key="key-a"), server.client(api_key="key-b")
        doc = _doc(7, 20)

        def cached(client: openai.OpenAI, messages: list[dict], **extra) -> int:
            reply = client.chat.completions.create(model=DEFAULT_MODEL, messages=messages, temperature=0,
                                                   max_tokens=2, **extra)
            return reply.usage.prompt_tokens_details.cached_tokens

        assert cached(a, doc) == 0
        assert cached(a, doc + [{"role": "assistant", "content": "Sure."}]) > 100  # A's own prefix
        assert cached(b, doc) == 0  # B: nothing of A's
        assert cached(b, doc + [{"role": "user", "content": "Again."}]) > 100  # B's own prefix now
        salted = {"extra_body": {"cache_salt": "project-1"}}
        assert cached(a, doc + [{"role": "user", "content": "Once more."}], **salted) == 0
        assert cached(a, doc + [{"role": "user", "content": "And again."}], **salted) > 100
        too_long = a.chat.completions.with_raw_response  # a salt is bounded
        with pytest.raises(openai.BadRequestError):
            too_long.create(model=DEFAULT_MODEL, messages=OTHER, max_tokens=1, extra_body={"cache_salt": "x" * 300})
    finally:
        server.stop()
