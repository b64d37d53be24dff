"""``/v1/completions`` (legacy text completions) through the official ``openai`` client on the
default server: string, list and token-id prompts, echo, streaming, stop strings, errors."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.conftest import DEFAULT_MODEL

PROMPT = "The capital of France is"


def _create(client, **kw):
    kw.setdefault("max_tokens", 8)
    kw.setdefault("temperature", 0)
    return client.completions.create(model=DEFAULT_MODEL, **kw)


def _token_ids(server, text: str) -> list[int]:
    return httpx.post(f"{server.url}/tokenize", json={"prompt": text}, timeout=60).json()["tokens"]


def test_string_prompt(client):
    reply = _create(client, prompt=PROMPT)
    assert reply.object == "text_completion" and reply.id.startswith("cmpl-")
    choice = reply.choices[0]
    assert "Paris" in choice.text and choice.finish_reason == "length"
    assert reply.usage.completion_tokens == 8 and reply.usage.prompt_tokens > 0


def test_token_id_prompt_equals_its_text(client, server):
    assert _create(client, prompt=_token_ids(server, PROMPT)).choices[0].text == _create(client, prompt=PROMPT).choices[0].text


def test_list_of_prompts_gives_one_choice_each_in_order(client, server):
    """Choice i answers prompt i (the prompts run as one batch, so the texts are compared by
    their answers, not token for token: see fresh_client in tests/conftest.py)."""
    capitals = {"France": "Paris", "Italy": "Rome", "Japan": "Tokyo"}
    prompts = [f"The capital of {country} is" for country in capitals]
    for prompt in (prompts, [_token_ids(server, p) for p in prompts]):
        reply = _create(client, prompt=prompt)
        assert [c.index for c in reply.choices] == [0, 1, 2]
        for choice, capital in zip(reply.choices, capitals.values()):
            assert capital in choice.text, (capital, choice.text)
    assert reply.usage.prompt_tokens == sum(len(ids) for ids in prompt)


def test_echo_puts_the_prompt_first(client):
    plain = _create(client, prompt=PROMPT).choices[0].text
    assert _create(client, prompt=PROMPT, echo=True).choices[0].text == PROMPT + plain


def test_stream_joins_to_the_whole_reply(client):
    prompts = [PROMPT, "One, two, three,"]
    whole = _create(client, prompt=prompts, echo=True)
    texts, finishes, usage = ["", ""], [None, None], None
    for chunk in _create(client, prompt=prompts, echo=True, stream=True, stream_options={"include_usage": True}):
        for choice in chunk.choices:
            texts[choice.index] += choice.text
            finishes[choice.index] = choice.finish_reason or finishes[choice.index]
        usage = chunk.usage or usage
    assert texts == [c.text for c in whole.choices]
    assert finishes == [c.finish_reason for c in whole.choices]
    assert usage.completion_tokens == whole.usage.completion_tokens


def test_stop_string(client):
    reply = _create(client, prompt=PROMPT, max_tokens=16, stop=["."])
    assert "." not in reply.choices[0].text and reply.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("kw, param", [
    ({"prompt": [10**9]}, "prompt"),
    ({"prompt": ["ok", [1]]}, "prompt.1"),  # a mixed list: its second item breaks the list of strings
    ({"prompt": PROMPT, "max_tokens": 10**6}, "max_tokens"),
    ({"prompt": PROMPT, "n": 9}, "n"),  # over --max-n
    ({"prompt": PROMPT, "n": 2, "best_of": 3}, "best_of"),
    ({"prompt": PROMPT, "suffix": "x"}, "suffix"),
])
def test_bad_requests_are_400(client, kw, param):
    with pytest.raises(openai.BadRequestError) as err:
        _create(client, **kw)
    assert err.value.body["param"] == param


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt=PROMPT, max_tokens=2)


def test_n_per_prompt(client):
    reply = _create(client, prompt=["The capital of France is", "The capital of Japan is"], n=2, max_tokens=6)
    assert [c.index for c in reply.choices] == [0, 1, 2, 3]  # prompt p's sample j is p * n + j
    assert all("Paris" in c.text for c in reply.choices[:2]) and all("Tokyo" in c.text for c in reply.choices[2:])
