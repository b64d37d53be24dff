"""A hostile pass over the streaming GLM parsers (behind the reasoning parser, as served): a
valid call cut at every point, and random tag soup fed in random pieces. No exception; the
stream joins to what the whole text parses to; and nothing the model wrote is lost: every word
of it is in the content, the reasoning, a call's name or its arguments."""

from __future__ import annotations

import random

import pytest

from glmserve.toolcalls import assemble, output_parser

TOOLS = [{"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}}}},
    {"name": "search", "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}]
TAGS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>",
        "</arg_value>"]
WORDS = [f"w{i}x" for i in range(40)]  # each soup's words are told apart from tags and names
OTHER = ["get_weather", "search", "city", "days", "query", "3", "[1, 2]", "{", "}", '"', "\\", "<", ">", "/",
         "\n", " ", "<tool", "</arg", "true", '{"city": "w0x"}']
PROMPTS = {"reasoning": "<|assistant|><think>", "answer": "<|assistant|></think>", "open": "<|assistant|>"}
CALL = ("<tool_call>get_weather<arg_key>city</arg_key><arg_value>Bonn am Rhein</arg_value>"
        "<arg_key>days</arg_key><arg_value>3</arg_value></tool_call>")


def _parse(name: str, state: str, pieces: list[str]):
    parser = output_parser(name, TOOLS, True, PROMPTS[state])
    return assemble([e for p in pieces for e in parser.feed(p)] + parser.finish())


def _chunks(text: str, rng: random.Random) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(text)), k=min(len(text) - 1, rng.randint(1, 12)))) if len(text) > 1 else []
    return [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)])]


@pytest.mark.parametrize("name", ["glm45", "glm47"])
@pytest.mark.parametrize("state", ["reasoning", "answer", "open"])
def test_a_call_cut_at_every_point_parses_as_it_would_whole(name, state):
    text = "Let me look.</think>" + CALL if state == "reasoning" else CALL
    whole = _parse(name, state, [text])
    assert [(c.name, c.arguments) for c in whole.tool_calls] == [
        ("get_weather", '{"city": "Bonn am Rhein", "days": 3}')]
    for cut in range(1, len(text)):
        assert _parse(name, state, [text[:cut], text[cut:]]) == whole
        # the output ends at the cut (the model stopped there): no exception, and no word lost
        head = _parse(name, state, [text[:cut]])
        _assert_nothing_lost(text[:cut], head)


def _assert_nothing_lost(text: str, parsed) -> None:
    written = " ".join([parsed.content or "", parsed.reasoning_content or "",
                        *(c.name + " " + c.arguments for c in parsed.tool_calls)])
    for word in WORDS + ["Bonn", "Rhein", "Let", "look"]:
        assert text.count(word) <= written.count(word), (word, text, parsed)


def soups(n: int = 300):
    """``n`` random tag soups: ``(soup, rng)``, the generator that made it (for cutting it)."""
    for seed in range(n):
        rng = random.Random(seed)
        words = iter(WORDS)
        # half of them open a call of an offered tool, so that the soup reaches the call's states
        head = "<tool_call>" + rng.choice(["get_weather", "search"]) + rng.choice(["<arg_key>", "\n"]) if seed % 2 else ""
        yield head + "".join(rng.choice(TAGS) if r < 0.4 else next(words, "w39x") if r < 0.6 else rng.choice(OTHER)
                             for r in (rng.random() for _ in range(rng.randint(1, 30)))), rng


@pytest.mark.parametrize("name", ["glm45", "glm47"])
@pytest.mark.parametrize("state", ["reasoning", "answer", "open"])
def test_tag_soup_streams_as_it_parses_whole_and_loses_no_word(name, state):
    for soup, rng in soups():
        whole = _parse(name, state, [soup])
        assert _parse(name, state, _chunks(soup, rng)) == whole, soup
        assert _parse(name, state, list(soup)) == whole, soup
        _assert_nothing_lost(soup, whole)
