"""N-gram drafts (prompt lookup) for ``--speculative ngram``: what is drafted, the adaptive
back-off, the counters; and that the other engines refuse the flag."""

from __future__ import annotations

import pytest

from glmserve.engine import check_engine_settings
from glmserve.engine.base import EngineError
from glmserve.engine.llama_cpp.speculative import FIRST_DRAFT, MAX_COOLDOWN, NgramDrafter, SpeculativeConfig
from glmserve.engine.types import SpecDecodeCounters
from glmserve.settings import ServeSettings


def drafter(**kwargs) -> NgramDrafter:
    return NgramDrafter(SpeculativeConfig(**kwargs))


def test_drafts_what_followed_the_latest_earlier_occurrence_of_the_last_ngram():
    d = drafter(ngram_min=2, ngram_max=3, draft_max=4)
    #          0  1  2  3  4  5  6  7  8  9 10
    tokens = [5, 6, 7, 1, 2, 5, 6, 9, 8, 5, 6]
    # (5, 6) occurs at 0 and 5: the latest, at 5, was followed by 9, 8, 5, 6
    assert d.propose(tokens, limit=4) == [9, 8, 5, 6]


def test_the_longest_matching_ngram_wins():
    d = drafter(ngram_min=1, ngram_max=3, draft_max=8)
    # (2, 3) alone would pick its latest occurrence (followed by 8); (1, 2, 3) matches earlier (4)
    tokens = [1, 2, 3, 4, 9, 2, 3, 8, 1, 2, 3]
    assert d.propose(tokens, limit=2) == [4, 9]


def test_no_match_no_draft_and_the_index_follows_growth():
    d = drafter(ngram_min=2, ngram_max=2, draft_max=4)
    tokens = [1, 2, 3, 4]
    assert d.propose(tokens, limit=4) == []
    tokens += [1, 2]  # the sequence grew: (1, 2) was seen at 0, followed by 3, 4
    assert d.propose(tokens, limit=4) == [3, 4, 1, 2]


def test_drafts_go_on_from_the_place_being_copied():
    d = drafter(ngram_min=2, ngram_max=2, draft_max=4)
    # two lookalike blocks: a copy of block A must go on drafting A, not the latest lookalike (B)
    a, b = [1, 2, 10, 11, 12, 13], [1, 2, 20, 21, 22, 23]
    tokens = a + b + [1, 2]
    assert d.propose(tokens, limit=2) == [20, 21]  # no place yet: the latest occurrence of (1, 2)
    tokens = a + b + [1, 2, 10]  # the sequence took A's token instead: no place, (2, 10) is in A only
    assert d.propose(tokens, limit=2) == [11, 12]
    tokens += [11, 12]  # it follows A: the place moves on with it
    assert d.propose(tokens, limit=4) == [13, 1, 2, 20]
    tokens += [99]  # a one-for-one substitution keeps the place ...
    tokens += [1]  # ... as soon as the sequence is back on it
    assert d.propose(tokens, limit=2) == [2, 20]


def test_the_draft_fits_the_limit_and_the_current_length():
    d = drafter(ngram_min=1, ngram_max=1, draft_max=16)
    tokens = [7, *range(100, 120), 7]
    assert len(d.propose(tokens, limit=100)) == FIRST_DRAFT  # starts short
    assert d.propose(tokens, limit=2) == [100, 101]
    assert d.propose(tokens, limit=0) == []


def test_accepted_drafts_grow_and_rejections_back_off():
    d = drafter(ngram_min=1, ngram_max=1, draft_max=16)
    tokens = [7, *range(100, 140), 7]
    d.record(FIRST_DRAFT, FIRST_DRAFT)
    assert len(d.propose(tokens, limit=100)) == 2 * FIRST_DRAFT
    d.record(8, 8)
    d.record(16, 16)
    assert len(d.propose(tokens, limit=100)) == 16  # capped at draft_max
    rested = []
    for _ in range(8):  # drafts rejected at their first token, in a row: 1, 2, 4, 8, 16, 16... steps of rest
        d.record(4, 0)
        skipped = 0
        while d.propose(tokens, limit=100) == []:
            skipped += 1
        rested.append(skipped)
    assert rested == [1, 2, 4, 8, 16, MAX_COOLDOWN, MAX_COOLDOWN, MAX_COOLDOWN]
    assert len(d.propose(tokens, limit=100)) == 2  # halved down to the shortest draft
    d.record(2, 1)  # a partly accepted draft ends the back-off
    assert d.propose(tokens, limit=100) != []


def test_config_bounds():
    with pytest.raises(ValueError):
        SpeculativeConfig(ngram_min=4, ngram_max=3)
    with pytest.raises(ValueError):
        SpeculativeConfig(draft_max=0)


def test_counters():
    c = SpecDecodeCounters()
    assert c.acceptance_rate is None
    c.add(4, 3)
    c.add(4, 1)
    assert (c.num_drafts, c.num_draft_tokens, c.num_accepted_tokens) == (2, 8, 4)
    assert c.acceptance_rate == 0.5
    assert "acceptance rate 50.0%" in c.describe()


def test_transformers_refuses_speculative_and_vllm_takes_it():
    for flags in ({"speculative": "ngram"}, {"speculative": "ngram", "spec_draft_max": 4}):
        with pytest.raises(EngineError, match="--spec.* is not used by the transformers engine"):
            check_engine_settings(ServeSettings(engine="transformers", **flags))
        check_engine_settings(ServeSettings(engine="vllm", **flags))  # vLLM's own ngram speculative_config


def test_transformers_refuses_a_draft_model_and_vllm_takes_it():
    flags = {"speculative": "draft", "draft_model": "draft.gguf"}
    with pytest.raises(EngineError, match="--draft-model.* is not used by the transformers engine"):
        check_engine_settings(ServeSettings(engine="transformers", **flags))
    for engine in ("llama_cpp", "vllm"):
        check_engine_settings(ServeSettings(engine=engine, **flags))


def test_spec_flags_need_speculative():
    with pytest.raises(ValueError, match="--spec-draft-max needs --speculative"):
        ServeSettings(spec_draft_max=4)
    with pytest.raises(ValueError, match="--spec-ngram-min is larger"):
        ServeSettings(speculative="ngram", spec_ngram_min=5, spec_ngram_max=3)
