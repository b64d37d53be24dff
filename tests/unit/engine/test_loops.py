"""The loop test of the loop guard (``engine/loops.py``): where it fires on a loop, and that it
does not on the real text nearest to one in the corpus of ``benchmarks/loop_guard_corpus.py``
(which fires there at shorter spans)."""

from __future__ import annotations

import random
import sysconfig
from pathlib import Path

import pytest

from glmserve.engine.loops import MAX_PERIOD, MIN_SPAN, LoopDetector

ROOT = Path(__file__).resolve().parents[3]


def _first(ids: list[int], detector: LoopDetector) -> tuple[int, int] | None:
    for i, token in enumerate(ids):
        found = detector.feed([token])
        if found:
            return i + 1, found.period
    return None


@pytest.mark.parametrize("period", [1, 2, 9, 26, MAX_PERIOD])
def test_a_loop_is_caught_once_its_span_is_written(period):
    unit = list(range(100, 100 + period))
    prefix = list(range(5000, 5300))  # text before the loop: not counted in its span
    assert _first(prefix + unit * (2 * MIN_SPAN // period), LoopDetector()) == (len(prefix) + MIN_SPAN, period)


def test_a_long_period_needs_its_repeats_and_a_longer_one_is_not_a_loop():
    unit = list(range(100, 164))  # 64 tokens: 256 tokens are 4 repeats; with 8 needed, 512
    assert _first(unit * 10, LoopDetector(min_repeats=8)) == (512, 64)
    assert _first(list(range(100, 165)) * 20, LoopDetector()) is None  # 65 tokens: past the longest period


def test_text_that_does_not_repeat_is_not_a_loop_and_outputs_of_several_tokens_are_read_whole():
    rng = random.Random(0)
    assert _first([rng.randrange(50000) for _ in range(20000)], LoopDetector()) is None
    detector = LoopDetector()
    assert detector.feed([7] * (MIN_SPAN - 1)) is None
    found = detector.feed([7, 7, 7])
    assert (found.period, found.span) == (1, MIN_SPAN + 2)
    with pytest.raises(ValueError):
        LoopDetector(max_period=0)


def test_find_stops_at_the_token_that_ends_a_loop():
    detector = LoopDetector()
    assert detector.find([7] * (MIN_SPAN - 2)) is None
    kept, found = detector.find([7, 7, 7, 7])  # the loop's span is written at the second of these
    assert (kept, found.period, found.span) == (2, 1, MIN_SPAN)
    assert detector.find([7])[1].span == MIN_SPAN + 1  # the two 7s after it were not fed


@pytest.mark.parametrize("path", [
    ROOT / "benchmarks" / "results" / "speculative-paired-before-after.md",  # "1.0, 1.0, 1.0, ..." in a JSON list
    Path(sysconfig.get_paths()["stdlib"]) / "ipaddress.py",  # "0.0.0.0.0.0.0.0..." in a docstring
])
def test_the_real_text_nearest_to_a_loop_is_not_one_at_the_defaults(path):
    from llama_cpp import Llama

    from glmserve.models import default_model_path

    vocab = Llama(str(default_model_path()), vocab_only=True, verbose=False)
    ids = vocab.tokenize(path.read_bytes(), add_bos=False, special=False)
    assert _first(ids, LoopDetector(min_span=32, min_repeats=3)) is not None  # shorter spans fire here
    assert _first(ids, LoopDetector()) is None
