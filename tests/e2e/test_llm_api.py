"""The in-process Python API (``glmserve.LLM``): same answers and shapes as the HTTP API."""

from __future__ import annotations

import asyncio

import pydantic
import pytest

from glmserve import LLM
from glmserve.protocol.chat import ChatCompletion
from glmserve.protocol.errors import APIError
from tests.conftest import DEFAULT_MODEL

MESSAGES = [{"role": "system", "content": "You are a helpful AI assistant."},
            {"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def llm():
    with LLM(n_threads=2) as model:
        yield model


def test_same_greedy_answer_as_http(llm, fresh_client):
    client = fresh_client
    local = llm.chat(MESSAGES, temperature=0, max_tokens=32)
    remote = client.chat.completions.create(model=DEFAULT_MODEL, messages=MESSAGES, temperature=0, max_tokens=32)
    assert isinstance(local, ChatCompletion)
    assert local.model == DEFAULT_MODEL == llm.model
    assert local.choices[0].message.content == remote.choices[0].message.content
    assert "Paris" in local.choices[0].message.content
    assert local.choices[0].finish_reason == remote.choices[0].finish_reason
    assert (local.usage.prompt_tokens, local.usage.completion_tokens) == (
        remote.usage.prompt_tokens, remote.usage.completion_tokens)
    # field for field the HTTP shape: the openai client's own model accepts it
    from openai.types.chat import ChatCompletion as OpenAIChatCompletion

    assert OpenAIChatCompletion.model_validate(local.model_dump()).choices[0].message.content == \
        local.choices[0].message.content


def test_stream_chunks_join_to_the_plain_result(llm):
    plain = llm.chat(MESSAGES, temperature=0, max_tokens=40, stop=["Paris"])
    chunks = list(llm.chat(MESSAGES, stream=True, temperature=0, max_tokens=40, stop=["Paris"]))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens


def test_async_variants(llm):
    async def run():
        plain = await llm.achat(MESSAGES, temperature=0, max_tokens=32)
        stream = await llm.achat(MESSAGES, stream=True, temperature=0, max_tokens=32)
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        both = await asyncio.gather(*(llm.achat(MESSAGES, temperature=0, max_tokens=32) for _ in range(3)))
        return plain, text, both

    plain, text, both = asyncio.run(run())
    assert text == plain.choices[0].message.content
    assert {b.choices[0].message.content for b in both} == {text}


def test_leaving_a_stream_early_aborts_it(llm):
    stream = llm.chat([{"role": "user", "content": "Count to a thousand."}], stream=True, max_tokens=3000,
                      ignore_eos=True)
    for i, _ in enumerate(stream):
        if i == 5:
            break
    stream.close()
    # the engine is free again: a new request completes normally
    assert llm.chat(MESSAGES, temperature=0, max_tokens=4).usage.completion_tokens == 4


def test_errors(llm):
    with pytest.raises(APIError) as info:
        llm.chat([{"role": "user", "content": "hi " * 5000}])
    assert info.value.status_code == 400 and info.value.code == "context_length_exceeded"
    with pytest.raises(pydantic.ValidationError):
        llm.chat([{"role": "user", "content": "hi"}], temperature=7)


def test_engine_health_follows_its_worker():
    """``Engine.check_health`` (Ray Serve's replica health check, ``/health``): fine while the
    worker thread runs, an ``EngineError`` once it is gone."""
    from glmserve.engine import EngineError

    model = LLM(n_threads=1)
    engine = model._runtime.engine
    engine.check_health()
    model.close()
    with pytest.raises(EngineError, match="worker thread"):
        engine.check_health()
