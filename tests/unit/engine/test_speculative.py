"""N-gram drafts for ``--speculative ngram``: what is drafted (prompt lookup, the cross-request
pool), when a draft is sent (the cost model: drafts that do not pay are held back, shadow
evaluation brings them back), a draft model's adaptive length, the counters; and that the other
engines refuse the flag."""

from __future__ import annotations

import random

import pytest

from glmserve.engine import check_engine_settings
from glmserve.engine.base import EngineError
from glmserve.engine.llama_cpp.speculative.draft_cost import (MARGIN, PRIOR_FIRST_ROW, PRIOR_ROW, Acceptance, StepCosts,
                                                  best_length)
from glmserve.engine.llama_cpp.speculative.ngram_pool import NgramPool
from glmserve.engine.llama_cpp.speculative import (FIRST_DRAFT, MAX_COOLDOWN, DraftLength, NgramDrafter,
                                                   SpeculativeConfig)
from glmserve.engine.types import SpecDecodeCounters
from glmserve.settings.serve import ServeSettings


def measured(extra_row_ms: float, rows: range = range(2, 18), t1_ms: float = 10.0, learn: bool = True) -> StepCosts:
    """Step costs measured on a machine where each draft row adds ``extra_row_ms``."""
    costs = StepCosts(learn)
    for _ in range(20):
        for r in rows:
            costs.record(1, t1_ms / 1000)
            costs.record(r, (t1_ms + extra_row_ms * (r - 1)) / 1000)
    return costs


class FreeRows(StepCosts):
    """Draft rows that cost nothing: every draft pays, and the longest is sent (what is drafted,
    apart from when)."""

    def scale(self) -> float:
        return 0.0


def drafter(costs: StepCosts | None = None, pool: NgramPool | None = None, salt: str | None = None,
            **kwargs) -> NgramDrafter:
    return NgramDrafter(SpeculativeConfig(**kwargs), costs or FreeRows(), pool, salt)


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
    assert len(d.propose(tokens, limit=100)) == 16  # draft_max
    assert d.propose(tokens, limit=2) == [100, 101]
    assert d.propose(tokens, limit=0) == []


def test_step_costs_learn_the_machine():
    prior = StepCosts()
    assert prior.ratio(1) == 1.0
    assert prior.ratio(2) == pytest.approx(1 + PRIOR_FIRST_ROW)
    assert prior.ratio(10) == pytest.approx(1 + PRIOR_FIRST_ROW + 8 * PRIOR_ROW)
    cpu = measured(3.5)  # 10 ms a step, 3.5 ms a row
    assert cpu.ratio(17) == pytest.approx(1 + 16 * 0.35, rel=0.1)
    gpu = measured(0.1)
    assert gpu.ratio(17) < 1.3
    one_length = measured(1.0, rows=range(9, 10))  # only 8-token drafts measured: the prior's shape
    assert one_length.ratio(9) == pytest.approx(1.8, abs=0.15)
    assert one_length.ratio(2) < one_length.ratio(9) < one_length.ratio(17)


def test_a_draft_is_sent_only_when_its_expected_gain_beats_its_cost():
    copying, guessing = Acceptance(), Acceptance()
    for _ in range(30):
        copying.observe(True)
        guessing.observe(False)
    cpu = StepCosts()
    k, gain = best_length(copying, cpu, 16)
    assert k > 4 and gain > 1 + MARGIN
    assert best_length(guessing, cpu, 16) == (0, 1.0)
    assert best_length(copying, cpu, 0) == (0, 1.0)
    # 40% of next tokens right, as when the model paraphrases: no length pays on a CPU's costs
    mixed = Acceptance()
    for i in range(100):
        mixed.observe(i % 5 < 2)
    assert best_length(mixed, cpu, 16) == (0, 1.0)
    assert best_length(mixed, measured(0.0), 16)[0] > 0  # free rows: it pays


def test_with_the_prior_fixed_drafts_depend_on_the_tokens_alone():
    """``--spec-ngram-cost prior``: steps measured dear (a loaded machine) or free change nothing,
    so the same tokens give the same drafts; learned, dear rows stop the drafts that the prior
    sends."""
    tokens = [random.Random(7).randrange(1000) for _ in range(40)] * 2
    fixed = [feed(drafter(costs=measured(extra, learn=False)), tokens, 80, 40) for extra in (0.0, 3.5, 30.0)]
    assert fixed[0] == fixed[1] == fixed[2] == feed(drafter(costs=StepCosts()), tokens, 80, 40)
    assert sum(map(len, fixed[0])) > 20  # the copy is drafted under the prior
    assert measured(30.0, learn=False).ratio(9) == StepCosts().ratio(9)
    assert sum(map(len, feed(drafter(costs=measured(30.0)), tokens, 80, 40))) == 0  # learned: rows too dear


def feed(d: NgramDrafter, tokens: list[int], upto: int, start: int) -> list[list[int]]:
    """The sequence generates ``tokens[start:upto]`` one token a step (no draft verified);
    returns what ``propose`` sent each step."""
    return [d.propose(tokens[:n], limit=16) for n in range(start, upto)]


def test_text_that_does_not_copy_is_never_drafted_on_a_cpu():
    d = drafter(costs=StepCosts(), ngram_min=1, ngram_max=2)
    # every bigram recurs, its continuation is a guess among 8
    rng = random.Random(0)
    tokens = [rng.randrange(8) for _ in range(400)]
    assert not any(feed(d, tokens, 400, 50))


def test_shadow_drafts_bring_drafting_back_when_the_sequence_starts_copying():
    d = drafter(costs=StepCosts(), ngram_min=2, ngram_max=3)
    block = list(range(100, 160))
    rng = random.Random(0)
    tokens = [*block, *(rng.randrange(200, 208) for _ in range(60)), *block]
    sent = feed(d, tokens, len(tokens), 61)
    assert not any(sent[:60])  # the non-copying part
    copy = sent[60:]
    assert not copy[0]  # the first right guesses are observed, not sent ...
    assert max(map(len, copy)) >= 8  # ... then long drafts of the block
    assert sum(map(bool, copy)) > len(copy) // 2


def test_the_pool_drafts_a_repeated_generation():
    pool = NgramPool(n=4, size=1 << 12)
    prompt = [1, 2, 3, 4, 5]
    answer = [(i * 37) % 101 + 10 for i in range(40)]  # no n-gram of it recurs within itself
    first = drafter(pool=pool, ngram_min=2, ngram_max=3)
    assert not any(feed(first, prompt + answer, len(prompt) + 40, len(prompt) + 1))
    first.finish(prompt + answer, len(prompt))
    again = drafter(pool=pool, ngram_min=2, ngram_max=3)
    tokens = prompt + answer
    n = len(prompt) + 1
    assert again.propose(tokens[:n], limit=16) == answer[1:17]
    assert pool.draft([9, 9, 9, 9], 4) == []  # an unknown n-gram
    assert pool.draft(tokens[:3], 4) == []  # shorter than n


def test_the_pool_drafts_only_from_generations_of_the_same_salt():
    """Another API key's generation never drafts for a request (issue 91, 7: the pool was a
    timing side channel across keys); the same key's, and a server's without salts, does."""
    pool = NgramPool(n=4, size=1 << 12)
    prompt, answer = [1, 2, 3, 4, 5], [(i * 37) % 101 + 10 for i in range(40)]
    tokens, n = prompt + answer, len(prompt) + 1
    drafter(pool=pool, ngram_min=2, ngram_max=3, salt="key-a").finish(tokens, len(prompt))
    assert drafter(pool=pool, ngram_min=2, ngram_max=3, salt="key-b").propose(tokens[:n], limit=16) == []
    assert drafter(pool=pool, ngram_min=2, ngram_max=3).propose(tokens[:n], limit=16) == []
    assert drafter(pool=pool, ngram_min=2, ngram_max=3, salt="key-a").propose(tokens[:n], limit=16) == answer[1:17]


def test_pool_slots_are_bounded_and_a_colliding_ngram_replaces_the_slot():
    pool = NgramPool(n=2, size=8)
    pool.add(list(range(100)), 0)
    assert len(pool._next) == 8
    assert pool.draft([97, 98], 1) == [99]  # the last n-grams written are there


def test_a_draft_model_drafts_grow_and_rejections_back_off():
    d = DraftLength(16)
    assert d.budget(100) == FIRST_DRAFT
    d.record(FIRST_DRAFT, FIRST_DRAFT)
    assert d.budget(100) == 2 * FIRST_DRAFT
    d.record(8, 8)
    d.record(16, 16)
    assert d.budget(100) == 16  # capped at draft_max
    rested = []
    for _ in range(8):  # drafts rejected at their first token, in a row: 1, 2, 4, 8, 16, 16... steps of rest
        d.record(4, 0)
        skipped = 0
        while d.budget(100) == 0:
            skipped += 1
        rested.append(skipped)
    assert rested == [1, 2, 4, 8, 16, MAX_COOLDOWN, MAX_COOLDOWN, MAX_COOLDOWN]
    assert d.budget(100) == 2  # halved down to the shortest draft
    d.record(2, 1)  # a partly accepted draft ends the back-off
    assert d.budget(100) > 0


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
    for other in ({}, {"speculative": "draft", "draft_model": "x.gguf"}):
        with pytest.raises(ValueError, match="--spec-ngram-cost is for --speculative ngram"):
            ServeSettings(**other, spec_ngram_cost="prior")
    assert ServeSettings(speculative="ngram", spec_ngram_cost="prior").spec_ngram_cost == "prior"
    with pytest.raises(ValueError, match="--spec-ngram-min is larger"):
        ServeSettings(speculative="ngram", spec_ngram_min=5, spec_ngram_max=3)
