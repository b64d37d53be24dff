"""End-to-end: the real server, the real default model, the official ``openai`` client."""

from __future__ import annotations

import openai

from tests.conftest import DEFAULT_MODEL

SYSTEM = {"role": "system", "content": "You are a helpful AI assistant."}
QUESTION = {"role": "user", "content": "What is the capital of France?"}


def _chat(client: openai.OpenAI, messages, **kwargs):
    return client.chat.completions.create(model=DEFAULT_MODEL, messages=messages, **kwargs)


def _stream_text(client: openai.OpenAI, messages, **kwargs) -> tuple[str, list]:
    chunks = list(_chat(client, messages, stream=True, **kwargs))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, chunks


def test_capital_of_france(client):
    reply = _chat(client, [SYSTEM, QUESTION], temperature=0, max_tokens=32)
    assert "Paris" in reply.choices[0].message.content
    assert reply.choices[0].finish_reason == "stop"
    assert reply.object == "chat.completion"
    assert reply.model == DEFAULT_MODEL
    assert reply.id.startswith("chatcmpl-")


def test_usage_adds_up(client):
    reply = _chat(client, [SYSTEM, QUESTION], temperature=0, max_tokens=32)
    usage = reply.usage
    assert usage.prompt_tokens > 10
    assert usage.completion_tokens >= 1
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    # same messages, same prompt size; a longer question, a longer prompt
    longer = _chat(client, [SYSTEM, {"role": "user", "content": QUESTION["content"] + " Please explain."}],
                   temperature=0, max_tokens=1)
    assert longer.usage.prompt_tokens > usage.prompt_tokens


def test_stream_equals_plain(fresh_client):
    client = fresh_client
    messages = [{"role": "user", "content": "Write a short poem about the sea."}]
    plain = _chat(client, messages, temperature=0, max_tokens=60)
    text, chunks = _stream_text(client, messages, temperature=0, max_tokens=60,
                                stream_options={"include_usage": True})
    assert text == plain.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert len({c.id for c in chunks}) == 1
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert [c.choices[0].finish_reason for c in finals] == [plain.choices[0].finish_reason]
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == []
    assert usage_chunk.usage.completion_tokens == plain.usage.completion_tokens
    assert usage_chunk.usage.prompt_tokens == plain.usage.prompt_tokens


def test_stream_without_usage_has_no_usage_chunk(client):
    _, chunks = _stream_text(client, [QUESTION], temperature=0, max_tokens=5)
    assert all(c.usage is None for c in chunks)
    assert all(c.choices for c in chunks)


def test_max_tokens_gives_length(client):
    reply = _chat(client, [{"role": "user", "content": "Count from 1 to 100."}], temperature=0, max_tokens=7)
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 7
    reply2 = _chat(client, [{"role": "user", "content": "Count from 1 to 100."}], temperature=0,
                   max_completion_tokens=5)
    assert reply2.usage.completion_tokens == 5


def test_ignore_eos_generates_exactly_max_tokens(client):
    reply = _chat(client, [SYSTEM, QUESTION], temperature=0, max_tokens=64, extra_body={"ignore_eos": True})
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 64


def test_stop_string_plain_and_stream(client):
    messages = [SYSTEM, QUESTION]
    full = _chat(client, messages, temperature=0, max_tokens=32).choices[0].message.content
    assert "Paris" in full
    stopped = _chat(client, messages, temperature=0, max_tokens=32, stop=["Paris"])
    assert stopped.choices[0].message.content == full[: full.index("Paris")]
    assert stopped.choices[0].finish_reason == "stop"
    # a stop string spanning several tokens must not leak its start into the stream
    text, _ = _stream_text(client, messages, temperature=0, max_tokens=32, stop="of France is Paris")
    assert text == full[: full.index("of France is Paris")]
    assert "of" not in text[text.rindex("capital"):]  # nothing of the stop string leaked


def test_stop_string_list_first_match_wins(client):
    messages = [SYSTEM, QUESTION]
    full = _chat(client, messages, temperature=0, max_tokens=32).choices[0].message.content
    reply = _chat(client, messages, temperature=0, max_tokens=32, stop=["Paris", "France"])
    assert reply.choices[0].message.content == full[: full.index("France")]


def test_seed_reproducible(client):
    messages = [{"role": "user", "content": "Tell me a story about a dragon."}]
    kw = dict(temperature=1.0, max_tokens=40, top_p=0.95)
    a = _chat(client, messages, seed=1234, **kw).choices[0].message.content
    b = _chat(client, messages, seed=1234, **kw).choices[0].message.content
    assert a == b
    others = {_chat(client, messages, seed=s, **kw).choices[0].message.content for s in (1, 2, 3)}
    assert len(others | {a}) > 1  # sampling does depend on the seed


def test_sampling_extensions_accepted(client):
    reply = _chat(client, [SYSTEM, QUESTION], temperature=0.7, max_tokens=16, seed=7,
                  presence_penalty=0.5, frequency_penalty=0.5,
                  extra_body={"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1})
    assert reply.choices[0].message.content
    assert reply.usage.completion_tokens <= 16


def test_multi_turn_history(client):
    messages = [
        SYSTEM,
        QUESTION,
        {"role": "assistant", "content": "The capital of France is Paris."},
        {"role": "user", "content": "What is its population?"},
    ]
    reply = _chat(client, messages, temperature=0, max_tokens=40)
    assert "Paris" in reply.choices[0].message.content  # "its" resolved from the history
    # the history is part of the prompt
    short = _chat(client, [SYSTEM, messages[-1]], temperature=0, max_tokens=40)
    assert reply.usage.prompt_tokens > short.usage.prompt_tokens + 10
    assert "Paris" not in short.choices[0].message.content


def test_content_as_text_parts(client):
    parts = [{"type": "text", "text": "What is the capital"}, {"type": "text", "text": "of France?"}]
    reply = _chat(client, [SYSTEM, {"role": "user", "content": parts}], temperature=0, max_tokens=32)
    assert "Paris" in reply.choices[0].message.content


def test_models_and_health(server, client):
    models = client.models.list().data
    assert [m.id for m in models] == [DEFAULT_MODEL]
    assert models[0].model_extra["max_model_len"] == 4096
    # the llama_cpp engine's defaults for the unset batch flags, and the queue that scales with them
    limits = {k: models[0].model_extra[k] for k in ("max_num_seqs", "max_num_batched_tokens", "max_queue")}
    assert limits == {"max_num_seqs": 8, "max_num_batched_tokens": 512, "max_queue": 64}
    assert "max_num_seqs=8, max_num_batched_tokens=512, max_queue=64" in server.log()
    assert client.models.retrieve(DEFAULT_MODEL).id == DEFAULT_MODEL
    import httpx

    assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}
