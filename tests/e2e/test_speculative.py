"""``--speculative ngram`` and ``--speculative draft`` end to end, through the ``openai`` client: the same greedy answers as a
server without speculation (plain, streamed, with stop strings and with a json_schema), the
same sampling distribution at temperature 1, vLLM's spec-decode counters in ``/metrics``, and
an abort while drafts are being verified frees the sequence; a repeated request is drafted from
the n-gram pool of earlier generations. (``--engine vllm``'s mapping onto vLLM's own ngram
speculation: tests/e2e/test_vllm_engine.py.)

Both servers get the same requests in the same order, from an empty KV cache: the README's known
limit (attention rounding follows the order of KV cells after heavy cache reuse) applies to both
alike. Prompt and answer stay within 256 tokens: past that, llama.cpp's KV window (padded to 256
cells) reaches 512 cells, where its CPU attention computes a lone query row (a decode step
without a draft) with the KV range split over the threads and a row verified among others in one
pass, so that a near-tie may be broken the other way after a few hundred tokens
(``benchmarks/verify_cost.py``; README, speculative decoding)."""

from __future__ import annotations

import collections
import json
import re
import time

import httpx
import pytest

from glmserve.models import default_model_path
from tests.conftest import DEFAULT_MODEL, RemoteServer

CODE = '''def total(items, scale=2):
    """Sum the values of items, scaled."""
    result = 0
    for item in items:
        result += item["value"] * scale
    return result
'''
DOC = {"name": "glmserve", "version": "1.4.2", "engines": ["llama_cpp", "transformers", "vllm"],
       "limits": {"max_num_seqs": 8, "n_ctx": 4096}}
# input-grounded (drafts are accepted) and natural prompts
PROMPTS = [
    f"Repeat this code exactly:\n\n{CODE}",
    f"Rewrite this code, renaming total to grand_total:\n\n{CODE}",
    f"Repeat this JSON exactly:\n\n{json.dumps(DOC, indent=2)}",
    f"Repeat this JSON, changing the version to 2.0.0:\n\n{json.dumps(DOC)}",
    "Repeat after me: the quick brown fox jumps over the lazy dog, the quick brown fox jumps over the lazy dog.",
    "Count from one to twenty in words, separated by commas.",
    "List the days of the week, then list them again.",
    "Copy this sentence three times: Speculative decoding drafts tokens from the prompt.",
    "Write the alphabet in capital letters with spaces between them.",
    f"Add a docstring to this function and repeat it:\n\n{CODE}",
    "What is the capital of France?",
    "Write a haiku about autumn.",
    "Explain what a CPU does in one sentence.",
    "Tell me a joke about cats.",
    "Name three famous painters.",
    "Describe the ocean in a few words.",
    "Why is the sky blue?",
    "Give me a tip for learning to cook.",
    "What does a librarian do?",
    "Write two sentences about a lighthouse.",
]
# the prompts streamed, and sent with stop strings or a json_schema: grounded and natural ones
SOME_PROMPTS = PROMPTS[:5] + PROMPTS[10:13]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "engines": {"type": "array", "items":
          {"type": "string"}}}, "required": ["name", "engines"]}


@pytest.fixture(scope="module")
def base():
    server = RemoteServer("--max-num-seqs", "2")
    yield server
    server.stop()


# --speculative draft: the bundled model drafts for itself (greedy drafts it then nearly always accepts);
# ngram with the cost model fixed at its prior (--spec-ngram-cost prior): whether a draft is sent
# depends on the tokens alone, so the draft counts asserted here do not depend on the machine's load
# (measured step costs on a loaded machine can hold every draft back)
METHODS = {"ngram": ("--speculative", "ngram", "--spec-ngram-cost", "prior"),
           "draft": ("--speculative", "draft", "--draft-model", str(default_model_path()))}


@pytest.fixture(scope="module", params=list(METHODS))
def servers(request, base):
    """The server without speculation, and one with each method in turn. The base server's
    answers are kept (``_ANSWERS``), so that each speculative server, fresh, gets the same
    requests in the same order as the base server did from its empty KV cache."""
    spec = RemoteServer("--max-num-seqs", "2", *METHODS[request.param])
    yield base, spec, request.param
    spec.stop()


MIN_ACCEPTANCE = {"ngram": 0.3, "draft": 0.9}
_ANSWERS: dict[str, object] = {}


def _base_answers(key: str, compute):
    if key not in _ANSWERS:
        _ANSWERS[key] = compute()
    return _ANSWERS[key]


def _messages(prompt: str) -> list[dict]:
    return [{"role": "user", "content": prompt}]


def _answers(server: RemoteServer, stream: bool, prompts: list[str], **extra) -> list[tuple[str, str, int]]:
    client = server.client()
    out = []
    for prompt in prompts:
        kwargs = dict(model=DEFAULT_MODEL, messages=_messages(prompt), temperature=0, max_tokens=80, **extra)
        if not stream:
            r = client.chat.completions.create(**kwargs)
            out.append((r.choices[0].message.content, r.choices[0].finish_reason, r.usage.completion_tokens))
            continue
        text, finish, usage = [], None, None
        for chunk in client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}):
            if chunk.choices:
                text.append(chunk.choices[0].delta.content or "")
                finish = chunk.choices[0].finish_reason or finish
            if chunk.usage:
                usage = chunk.usage.completion_tokens
        out.append(("".join(text), finish, usage))
    return out


def _spec_counters(server: RemoteServer) -> dict[str, float]:
    text = httpx.get(f"{server.url}/metrics").text
    return {name: float(value) for name, value in
            re.findall(r"^glmserve:(spec_decode_\w+)_total\{[^}]*\} (\S+)$", text, re.M)}


def test_greedy_answers_are_those_without_speculation(servers):
    base, spec, method = servers
    for stream, prompts in ((False, PROMPTS), (True, SOME_PROMPTS)):
        expected = _base_answers(f"greedy {stream}", lambda: _answers(base, stream, prompts))
        got = _answers(spec, stream, prompts)
        for prompt, want, have in zip(prompts, expected, got):
            assert have == want, (stream, prompt)
    # the grounded prompts were drafted and mostly accepted
    counters = _spec_counters(spec)
    assert counters["spec_decode_num_drafts"] > 0
    assert 0 < counters["spec_decode_num_accepted_tokens"] <= counters["spec_decode_num_draft_tokens"]
    # ngram: the grounded half of the prompts; draft: the model drafting for itself
    assert counters["spec_decode_num_accepted_tokens"] / counters["spec_decode_num_draft_tokens"] > MIN_ACCEPTANCE[method]


def test_stop_strings_and_json_schema_hold(servers):
    base, spec, method = servers
    before = _spec_counters(spec)
    for extra in ({"stop": ["\n\n", "fox"]},
                  {"response_format": {"type": "json_schema", "json_schema": {"name": "doc", "schema": SCHEMA}}}):
        want = _base_answers(json.dumps(extra), lambda: _answers(base, False, SOME_PROMPTS, **extra))
        got = _answers(spec, False, SOME_PROMPTS, **extra)
        assert got == want, extra
        if "stop" in extra:
            assert all("fox" not in text for text, _, _ in got)
        else:
            for text, finish, _ in got:
                if finish == "stop":
                    assert set(json.loads(text)) >= {"name", "engines"}
    assert _spec_counters(spec)["spec_decode_num_accepted_tokens"] > before["spec_decode_num_accepted_tokens"]


def test_sampling_distribution_is_unchanged(servers):
    """60 seeded samples at temperature 1 from each server: the token frequencies of the two
    sets of answers are within a total variation distance of 0.1 (the same seed draws the same
    random numbers in the same order with or without drafts, so nearly every answer matches)."""
    base, spec, method = servers
    prompt = "Repeat this list, then continue it: apple, banana, cherry, apple, banana, cherry, apple, banana,"

    def sample(server: RemoteServer) -> collections.Counter:
        client = server.client()
        counts: collections.Counter = collections.Counter()
        for seed in range(60):
            r = client.completions.create(model=DEFAULT_MODEL, prompt=prompt, temperature=1.0, max_tokens=12,
                                          seed=seed, logprobs=0)
            counts.update(r.choices[0].logprobs.tokens)
        return counts

    before = _spec_counters(spec)
    a, b = _base_answers("samples", lambda: sample(base)), sample(spec)
    na, nb = sum(a.values()), sum(b.values())
    tv = 0.5 * sum(abs(a[t] / na - b[t] / nb) for t in set(a) | set(b))
    assert tv < 0.1, (tv, a.most_common(10), b.most_common(10))
    assert _spec_counters(spec)["spec_decode_num_drafts"] > before["spec_decode_num_drafts"]


def test_a_repeated_request_is_drafted_from_earlier_generations(servers):
    """``ngram``: a request for text that does not copy its prompt, sent twice: the second time
    most of its tokens come from accepted drafts (the engine's n-gram pool holds the first
    answer), and the answer is the one without speculation."""
    base, spec, method = servers
    if method != "ngram":
        pytest.skip("the n-gram pool is --speculative ngram's")
    kwargs = dict(model=DEFAULT_MODEL, temperature=0, max_tokens=120,
                  messages=_messages("Write a short story about a fox who learns to swim."))
    want = _base_answers("repeated", lambda: base.client().chat.completions.create(**kwargs).choices[0].message.content)
    client = spec.client()
    assert client.chat.completions.create(**kwargs).choices[0].message.content == want
    before = _spec_counters(spec)
    again = client.chat.completions.create(**kwargs)
    after = _spec_counters(spec)
    assert again.choices[0].message.content == want
    accepted = after["spec_decode_num_accepted_tokens"] - before["spec_decode_num_accepted_tokens"]
    drafted = after["spec_decode_num_draft_tokens"] - before["spec_decode_num_draft_tokens"]
    assert accepted >= again.usage.completion_tokens / 2, (accepted, drafted, again.usage.completion_tokens)
    assert accepted / drafted > 0.9


def test_abort_while_drafting_frees_the_sequence(servers):
    _, spec, _ = servers
    body = {"model": DEFAULT_MODEL, "messages": _messages(PROMPTS[2] * 4), "temperature": 0, "max_tokens": 600,
            "stream": True}
    before = _spec_counters(spec)["spec_decode_num_drafts"]
    for _ in range(2):  # both sequences of --max-num-seqs 2
        with httpx.stream("POST", f"{spec.url}/v1/chat/completions", json=body, timeout=60) as resp:
            for n, _line in enumerate(resp.iter_lines()):
                if n > 40:
                    break  # closes the connection mid-generation
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        metrics = httpx.get(f"{spec.url}/metrics").text
        running = re.search(r"^glmserve:num_requests_running\{[^}]*\} (\S+)$", metrics, re.M)
        if running and float(running.group(1)) == 0:
            break
        time.sleep(0.2)
    else:
        pytest.fail("the aborted requests still run")
    assert _spec_counters(spec)["spec_decode_num_drafts"] > before
    r = spec.client().chat.completions.create(
        model=DEFAULT_MODEL, messages=_messages(PROMPTS[0]), temperature=0, max_tokens=40, n=2)
    assert [c.finish_reason for c in r.choices] == ["length", "length"]


# --batch-invariant: prompts whose greedy answers hold near-ties (code with one identifier renamed,
# numbers to change), half of them past 512 KV cells, where llama.cpp's CPU attention computes a
# lone query row (a one-token step) otherwise than a row verified among a draft's
LONG_CODE = "\n".join(f"def step_{i}(values, rate={i + 2}):\n    total = 0\n    for value in values:\n"
                      f"        total = total + value * rate + {i * 7 % 10}\n    return total\n" for i in range(12))
NEAR_TIES = [
    *(f"Repeat this code, renaming `{old}` to `{new}`:\n\n{LONG_CODE}"
      for old, new in [("values", "items"), ("total", "acc"), ("rate", "factor"), ("value", "v"), ("step_3", "third"),
                       ("total", "sum_"), ("values", "xs"), ("rate", "k"), ("value", "item"), ("step_0", "first")]),
    *(f"Repeat these numbers, adding {k} to each: " + ", ".join(str(n * 37 % 101 + k) for n in range(24))
      for k in (3, 7)),
    *(f"Repeat this code, renaming `{old}` to `{new}`:\n\n{CODE}"
      for old, new in [("total", "sum_values"), ("scale", "factor")]),
]


@pytest.fixture(scope="module")
def invariant_answers():
    """The greedy answers of a ``--batch-invariant`` server without speculation to ``NEAR_TIES``,
    with their total tokens: the speculative server, fresh, gets the same requests in the same
    order."""
    base = RemoteServer("--max-num-seqs", "2", "--batch-invariant")
    try:
        client = base.client()
        answers = [client.chat.completions.create(**_near_tie(prompt)) for prompt in NEAR_TIES]
    finally:
        base.stop()
    return [(r.choices[0].message.content, r.usage.total_tokens) for r in answers]


def _near_tie(prompt: str) -> dict:
    return dict(model=DEFAULT_MODEL, messages=_messages(prompt), temperature=0, max_tokens=96)


@pytest.fixture(scope="module")
def invariant_spec():
    """A fresh ``--batch-invariant`` server drafting with a draft model. Both draft sources go
    through the same verification (a draft's rows decoded among the batch's, against one-token
    steps); the draft model drafts at every step."""
    spec = RemoteServer("--max-num-seqs", "2", "--batch-invariant", *METHODS["draft"])
    yield spec
    spec.stop()


def test_under_batch_invariant_drafts_never_change_a_greedy_answer(invariant_answers, invariant_spec):
    """Speculation gives exactly the tokens of plain decoding, prompt after prompt, on near-ties
    past 512 KV cells too (``engine/llama_cpp/params.py``, ``context_params``)."""
    spec, past_512 = invariant_spec, 0
    for prompt, (want, total_tokens) in zip(NEAR_TIES, invariant_answers):
        have = spec.client().chat.completions.create(**_near_tie(prompt))
        assert have.choices[0].message.content == want, prompt
        past_512 += total_tokens > 512
    assert past_512 >= 10
    # drafts were verified (without one-token steps on one thread one of the answers here differed)
    assert _spec_counters(spec)["spec_decode_num_accepted_tokens"] > 0
