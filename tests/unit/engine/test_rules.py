"""The request rules the engines share (``glmserve.engine.rules``), and how their text tells a
tag token from the same characters of other tokens (``TagEscaper``)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from glmserve.engine.base import EngineError
from glmserve.engine.rules import (
    TAG_BREAK,
    TagEscaper,
    check_request,
    escaped_tags,
    finish_reason,
    model_text,
    stop_token_ids,
    tag_escaper,
    unescape_tags,
)
from glmserve.engine.types import GenerationRequest, ModelInfo, SamplingParams

INFO = ModelInfo(id="m", context_length=10, chat_template="", bos_token="", eos_token="", lora_adapters=("tuned",))


def _request(n_prompt: int, lora: str | None = None) -> GenerationRequest:
    return GenerationRequest("r", list(range(1, n_prompt + 1)), SamplingParams(max_tokens=4), lora=lora)


def test_check_request():
    check_request(_request(9), INFO)
    check_request(_request(3, "tuned"), INFO)
    with pytest.raises(EngineError, match="does not fit the context of 10"):
        check_request(_request(10), INFO)
    with pytest.raises(EngineError, match="unknown LoRA adapter 'other'"):
        check_request(_request(3, "other"), INFO)


def test_stop_token_ids():
    assert stop_token_ids(SamplingParams(max_tokens=1, stop_token_ids=(7,)), frozenset({2})) == {2, 7}
    assert stop_token_ids(SamplingParams(max_tokens=1, stop_token_ids=(7,), ignore_eos=True), frozenset({2})) == set()


@pytest.mark.parametrize(("token", "num_generated", "num_tokens", "expected"), [
    (5, 1, 6, None),
    (2, 1, 6, "stop"),       # a stop token wins over the limits
    (2, 4, 10, "stop"),
    (5, 4, 9, "length"),     # max_tokens reached
    (5, 2, 10, "length"),    # the context is full
])
def test_finish_reason(token, num_generated, num_tokens, expected):
    assert finish_reason(token, frozenset({2}), num_generated, num_tokens, max_tokens=4, context_length=10) == expected


def test_tag_escaper_tells_tag_tokens_from_their_look_alikes():
    """Random text in random pieces, tags among them as tokens and as ordinary text split
    anywhere, and the escape character itself: the escaped text holds each tag exactly where a
    tag token wrote it, and unescapes to what was written."""
    tags = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>"]
    alphabet = [*tags, "<", "</", "<tool", "_call>", "think>", "x", " ", "\n", TAG_BREAK, TAG_BREAK * 2, "ö"]
    for seed in range(500):
        rng = random.Random(seed)
        escaper, written, escaped, real = TagEscaper(tags), "", "", Counter()
        for _ in range(rng.randint(1, 40)):
            if rng.random() < 0.2:
                tag = rng.choice(tags)
                escaped += escaper.feed(tag, tag=True)
                real[tag] += 1
                written += tag
            else:
                text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 4)))
                cut = rng.randint(0, len(text))  # an ordinary tag may come in two pieces
                escaped += escaper.feed(text[:cut]) + escaper.feed(text[cut:])
                written += text
        escaped += escaper.flush()
        assert unescape_tags(escaped) == written
        assert {t: escaped.count(t) for t in tags} == {t: real[t] for t in tags}, (seed, escaped)


def test_without_tags_there_is_no_escaper_and_text_is_kept():
    assert tag_escaper([]) is None
    assert unescape_tags("plain <think> text") == "plain <think> text"


def test_a_grammar_writes_its_tags_as_text_so_nothing_is_escaped():
    tags = frozenset({7, 8})
    free = GenerationRequest("r", [1], SamplingParams(max_tokens=4), shown_special_ids=tags)
    constrained = GenerationRequest("r", [1], SamplingParams(max_tokens=4, grammar='root ::= "x"'),
                                    shown_special_ids=tags)
    assert (escaped_tags(free), escaped_tags(constrained)) == (tags, frozenset())


def test_only_text_the_engine_escaped_is_unescaped():
    """A ``TAG_BREAK`` the model writes where nothing was escaped (no tag tokens, or a grammar)
    stands for itself; where the engine escaped, doubled ones are written once."""
    text = "a" + TAG_BREAK * 2 + "b"
    plain = GenerationRequest("r", [1], SamplingParams(max_tokens=4))
    constrained = GenerationRequest("r", [1], SamplingParams(max_tokens=4, grammar='root ::= "x"'),
                                    shown_special_ids=frozenset({7}))
    escaped = GenerationRequest("r", [1], SamplingParams(max_tokens=4), shown_special_ids=frozenset({7}))
    assert [model_text(r, text) for r in (plain, constrained, escaped)] == [text, text, "a" + TAG_BREAK + "b"]
