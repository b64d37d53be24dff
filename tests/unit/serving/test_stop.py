"""Stop-string hold-back: nothing of a stop string ever reaches the client."""

from __future__ import annotations

import random

import pytest

from glmserve.serving.generation.stop import StopStringMatcher


def _run(stops, deltas, escaped=False):
    m = StopStringMatcher(stops, escaped)
    sent = []
    for d in deltas:
        text, stopped = m.feed(d)
        sent.append(text)
        if stopped:
            return "".join(sent), True
    return "".join(sent) + m.flush(), False


def test_no_stops_passes_through():
    m = StopStringMatcher([])
    assert m.feed("abc") == ("abc", False)


def test_stop_inside_one_delta():
    assert _run(["STOP"], ["hello STOP world"]) == ("hello ", True)


def test_stop_split_across_deltas_is_held_back():
    m = StopStringMatcher(["<end>"])
    assert m.feed("foo <e") == ("foo ", False)
    assert m.feed("n") == ("", False)
    assert m.feed("d> bar") == ("", True)


def test_false_alarm_is_released():
    m = StopStringMatcher(["<end>"])
    assert m.feed("a <en") == ("a ", False)
    assert m.feed("try") == ("<entry", False)
    assert m.flush() == ""


def test_flush_returns_held_tail_at_end():
    m = StopStringMatcher(["xyz"])
    assert m.feed("abcxy") == ("abc", False)
    assert m.flush() == "xy"


def test_earliest_stop_wins():
    assert _run(["world", "lo w"], ["hello world"]) == ("hel", True)


def test_after_stop_nothing_more():
    m = StopStringMatcher(["."])
    assert m.feed("a.b") == ("a", True)
    assert m.feed("more") == ("", True)


@pytest.mark.parametrize("seed", range(20))
def test_any_split_gives_the_same_result(seed):
    rng = random.Random(seed)
    text = "The capital of France is Paris. It is known for the Eiffel Tower."
    stops = rng.sample(["Paris", "Eiffel", "is P", "xyz", "France is", ". It"], k=2)
    expected_cut = min((text.find(s) for s in stops if s in text), default=-1)
    expected = (text[:expected_cut], True) if expected_cut >= 0 else (text, False)
    cuts = sorted(rng.sample(range(1, len(text)), k=rng.randint(1, 20)))
    deltas = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)])]
    assert _run(stops, deltas) == expected
    assert _run(stops, list(text)) == expected


def _escaped(text: str) -> list[str]:
    """``text`` as an engine's ``TagEscaper`` writes it, one token per character, with the
    tags ``</think>`` and ``<tool_call>`` spelled by ordinary tokens."""
    from glmserve.engine.rules import TagEscaper

    escaper = TagEscaper(["</think>", "<tool_call>"])
    return [escaper.feed(ch) for ch in text] + [escaper.flush()]


@pytest.mark.parametrize("stop", ["</think>", "<tool_call>", "think>", "\ue000"])
def test_a_stop_string_matches_what_the_model_wrote_not_the_escaped_text(stop):
    """A tag spelled by ordinary tokens reaches the matcher escaped (``<`` U+E000 ``/think>``);
    the stop string still stops there (issue 90), and what is released before it is the escaped
    text the parsers read."""
    from glmserve.engine.rules import unescape_tags

    text = "I wrote \ue000 then </think> then <tool_call> and think> end"
    sent, stopped = _run([stop], _escaped(text), escaped=True)
    assert stopped
    assert unescape_tags(sent) == text[:text.index(stop)]


def test_escaped_text_without_a_stop_is_released_whole():
    from glmserve.engine.rules import unescape_tags

    text = "a </think b </think> c <tool_call"
    pieces = _escaped(text)
    sent, stopped = _run(["</think>x"], pieces, escaped=True)
    assert (unescape_tags(sent), stopped) == (text, False)
    assert sent == "".join(pieces)

