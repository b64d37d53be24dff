"""OpenAI surface beyond chat: ``/tokenize`` and ``/detokenize`` (vLLM's shapes),
``logit_bias``, the error for an unknown route, and the choices' fields OpenAI writes as null, on
the default server."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.conftest import DEFAULT_MODEL

ASK = [{"role": "user", "content": "What is the capital of France?"}]


def _post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=60)


def test_tokenize_detokenize_round_trip(server):
    text = "Hello world, ünïcode 日本 and <|im_end|> markup"
    tokens = _post(server, "/tokenize", {"model": DEFAULT_MODEL, "prompt": text, "return_token_strs": True}).json()
    assert tokens["count"] == len(tokens["tokens"]) and tokens["max_model_len"] > 0
    assert tokens["token_strs"][:2] == ["Hello", " world"]
    assert _post(server, "/detokenize", {"model": DEFAULT_MODEL, "tokens": tokens["tokens"]}).json() == {"prompt": text}


def test_chat_tokenize_counts_what_a_chat_request_is_charged(server, client):
    tools = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
    for extra in ({}, {"tools": tools}):
        counted = _post(server, "/tokenize", {"model": DEFAULT_MODEL, "messages": ASK, **extra}).json()["count"]
        reply = client.chat.completions.create(model=DEFAULT_MODEL, messages=ASK, max_tokens=1, **extra)
        assert counted == reply.usage.prompt_tokens


@pytest.mark.parametrize("path, body, status, param", [
    ("/tokenize", {"model": "nope", "prompt": "x"}, 404, "model"),
    ("/detokenize", {"tokens": [10**9]}, 400, "tokens"),
    ("/tokenize", {"prompt": 3}, 400, "prompt"),
])
def test_tokenize_errors(server, path, body, status, param):
    resp = _post(server, path, body)
    assert resp.status_code == status and resp.json()["error"]["param"] == param


def test_logit_bias_banning_the_greedy_token_changes_the_output(client, server):
    plain = client.chat.completions.create(model=DEFAULT_MODEL, messages=ASK, max_tokens=12, temperature=0)
    text = plain.choices[0].message.content
    first = _post(server, "/tokenize", {"prompt": text, "add_special_tokens": False}).json()["tokens"][0]
    banned = client.chat.completions.create(model=DEFAULT_MODEL, messages=ASK, max_tokens=12, temperature=0,
                                            logit_bias={str(first): -100})
    assert banned.choices[0].message.content and not banned.choices[0].message.content.startswith(
        _post(server, "/detokenize", {"tokens": [first]}).json()["prompt"])
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=DEFAULT_MODEL, messages=ASK, max_tokens=1, logit_bias={"9999999": 1})
    assert err.value.body["param"] == "logit_bias" and "9999999" in err.value.body["message"]


def test_unknown_route_is_an_openai_404_naming_it(server):
    resp = _post(server, "/v1/embeddingz", {})
    assert resp.status_code == 404
    assert resp.json()["error"] == {"message": "Invalid URL (POST /v1/embeddingz)", "type": "not_found_error",
                                    "param": None, "code": None}


def _samples(server) -> dict[tuple[str, tuple], float]:
    from prometheus_client.parser import text_string_to_metric_families

    resp = httpx.get(f"{server.url}/metrics", timeout=30)
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(resp.text) for s in family.samples}


def test_metrics_parse_and_move_with_traffic(server, client):
    model = (("model_name", DEFAULT_MODEL),)
    before = _samples(server)
    reply = client.chat.completions.create(model=DEFAULT_MODEL, messages=ASK, max_tokens=5, temperature=0)
    after = _samples(server)

    def moved(name, labels=model):
        return after.get((name, labels), 0) - before.get((name, labels), 0)

    assert moved("glmserve:prompt_tokens_total") == reply.usage.prompt_tokens
    assert moved("glmserve:generation_tokens_total") == reply.usage.completion_tokens
    finished = tuple(sorted((*model, ("finished_reason", reply.choices[0].finish_reason))))
    assert moved("glmserve:request_success_total", finished) == 1
    assert moved("glmserve:time_to_first_token_seconds_count") == 1
    assert moved("glmserve:e2e_request_latency_seconds_count") == 1
    assert moved("glmserve:prefix_cache_queries_total") == reply.usage.prompt_tokens
    assert after[("glmserve:num_requests_running", model)] == 0
    assert 0 < after[("glmserve:kv_cache_usage_perc", model)] <= 1  # the finished request's cells stay cached


def test_n_choices_plain_and_streamed(client):
    kw = {"model": DEFAULT_MODEL, "messages": [{"role": "user", "content": "Name a color."}], "n": 3,
          "max_tokens": 8, "temperature": 1.0, "seed": 11}
    reply = client.chat.completions.create(**kw)
    assert [c.index for c in reply.choices] == [0, 1, 2] and all(c.message.content for c in reply.choices)
    assert len({c.message.content for c in reply.choices}) > 1  # seeds 11, 12, 13
    assert 3 <= reply.usage.completion_tokens <= 24
    single = client.chat.completions.create(**{**kw, "n": 1})
    assert reply.usage.prompt_tokens == single.usage.prompt_tokens  # the prompt counts once
    texts, roles, finishes = {}, set(), {}
    for chunk in client.chat.completions.create(**kw, stream=True):
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
            roles |= {choice.index} if choice.delta.role else set()
            finishes[choice.index] = choice.finish_reason or finishes.get(choice.index)
    assert roles == {0, 1, 2} and all(texts.values()) and all(finishes.values())
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(**{**kw, "n": 9})  # over --max-n (8)
    assert err.value.body["param"] == "n"


def _sse_json(server, path: str, body: dict) -> list[dict]:
    with httpx.stream("POST", f"{server.url}{path}", json=body, timeout=60) as r:
        assert r.status_code == 200
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]


@pytest.mark.parametrize("path, ask", [("/v1/chat/completions", {"messages": ASK}),
                                       ("/v1/completions", {"prompt": "The capital of France is"})])
def test_choices_write_finish_reason_and_logprobs_as_null_as_openai_does(server, path, ask):
    # raw JSON, as a client reading the stream itself sees it (the openai client fills absent fields with None)
    body = {"model": DEFAULT_MODEL, "max_tokens": 6, "temperature": 0, "ignore_eos": True, **ask}
    plain = _post(server, path, body).json()["choices"][0]
    assert plain["finish_reason"] == "length" and plain["logprobs"] is None
    chunks = _sse_json(server, path, {**body, "stream": True, "stream_options": {"include_usage": True}})
    choices = [c["choices"][0] for c in chunks if c["choices"]]
    # the first token goes out alone; later ones may go out together (--stream-interval-ms)
    assert len(choices) >= 2 and chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6
    assert [c["finish_reason"] for c in choices] == [None] * (len(choices) - 1) + ["length"]
    assert all(c["logprobs"] is None for c in choices)
    assert not any("stop_reason" in c for c in choices)  # vLLM's extension: only when a stop string ended it
