"""Speculative decoding for the llama_cpp engine. This package's modules are the draft sources
and what decides about drafts: here, n-gram drafts (prompt lookup and the shared ``NgramPool``,
``ngram_pool.py``), the adaptive draft length of a model's drafts, and the verification rule;
``draft_cost.py`` (when an n-gram draft pays), ``draft_model.py`` (a draft GGUF), ``mtp.py``
(the model's own NextN layers).

Drafting (prompt lookup decoding, Saxena 2023; vLLM's ``ngram`` method, llama.cpp's
``--spec-type ngram-simple``): the last ``n`` tokens of a sequence (prompt and output so far),
for ``n`` from ``ngram_max`` down to ``ngram_min``, are looked up among its earlier tokens; the
tokens that followed their most recent earlier occurrence are the draft. Once a draft is taken
from a place, the next drafts continue from that same place (moved on by as many tokens as the
sequence grew) for as long as the sequence keeps following it, that is, while its last token is
the one before the place: a reply that copies a module of six similar functions is drafted from
the function it is copying, not from the most recent lookalike line, and a one-for-one
substitution (a renamed identifier of as many tokens) does not lose the place. Input-grounded
work (rewrite this file with one change, repeat this JSON) is drafted right most of the time.
Drafts also come from n-gram statistics of other sequences' generations (``ngram_pool.py``).

Verification (the engine): the sequence's last token and its draft are decoded in the step's
one batch, with logits on every row; the engine then samples row after row with the sequence's
own sampler chain and stops at the first sampled token that differs from the draft. Every
sampled token is emitted, so a step gives 1 to ``len(draft) + 1`` tokens. For a draft that is a
single token (``q`` a point mass on ``d``), drawing ``t ~ p`` and accepting iff ``t == d`` is
the speculative-sampling rule of Leviathan et al. 2023 / Chen et al. 2023: ``d`` is kept with
probability ``min(1, p(d)/q(d)) = p(d)``, and a rejected position gives ``t ~ p`` given
``t != d``, which is their residual ``norm(max(0, p - q))``. The output distribution is
unchanged at any temperature; greedy output, penalties, ``logit_bias`` and grammars
(the chain records each accepted token) are those of decoding without a draft, and a seeded
request draws the same random numbers in the same order.

When n-gram drafts pay (``draft_cost.py``): every source's proposal is compared with the
tokens the sequence then generates, drafted or not, and a draft is sent only when its expected
yield, from those acceptance rates, beats the measured cost of its rows by ``MARGIN``; its
length is the one with the best expected gain. Text that does not copy its input (n-grams recur
without their continuations) is then decoded as without speculation.

Adaptive (``DraftLength``, a draft model's drafts, which cost a draft-model decode each and so
get no shadow evaluation): a sequence's drafts start short (``FIRST_DRAFT``) and double while
wholly accepted, up to ``draft_max``; a sequence whose draft is rejected at its first token
skips drafting for a number of steps that doubles with each such draft in a row (up to
``MAX_COOLDOWN``), and its next draft is half as long.
"""

from __future__ import annotations

import hashlib

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from glmserve.engine.llama_cpp.speculative.draft_cost import Acceptance, StepCosts, best_length
from glmserve.engine.llama_cpp.speculative.ngram_pool import NgramPool
from glmserve.engine.llama_cpp.kv.scheduler import Scheduler
from glmserve.engine.llama_cpp.kv.sequence import Chunk, Sequence

P_MIN = 0.75  # a greedy draft ends before a less probable token (llama.cpp's --spec-draft-p-min)
MAX_COOLDOWN = 16  # steps without drafting after repeated first-token rejections
MIN_DRAFT = 2  # a draft shorter than this costs a batch row and rarely pays
# drafts only in steps that decode at most this many sequences and carry no prompt chunk (vLLM's
# speculative_disable_by_batch_size): a CPU step of more rows is compute-bound, each draft token
# then costs about what a decoded one does (measured, benchmarks/speculative.py, grounded c=8, one
# round each: drafts in steps of up to 2 decoding sequences, prompt chunks included, 0.95x of no
# speculation; with no prompt chunk 0.98x; one decoding sequence alone 1.07x)
MAX_DRAFTING_BATCH = 1
FIRST_DRAFT = 4  # a sequence's first drafts are this long at most; they double while all accepted


@dataclass(slots=True, frozen=True)
class SpeculativeConfig:
    """``--speculative ngram`` with ``--spec-ngram-min/max`` (n-gram lengths looked up, in
    tokens), ``--speculative draft`` with ``draft_model`` (the draft GGUF file), or
    ``--speculative mtp`` (``mtp``); each with ``--spec-draft-max`` (tokens drafted per sequence
    and step)."""

    ngram_min: int = 2
    ngram_max: int = 4
    draft_max: int = 16
    draft_model: Path | None = None  # --speculative draft
    mtp: bool = False  # --speculative mtp: the model's own NextN layers (mtp.py)

    def __post_init__(self) -> None:
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError("1 <= spec_ngram_min <= spec_ngram_max required")
        if self.draft_max < 1:
            raise ValueError("spec_draft_max >= 1 required")

    @property
    def method(self) -> str:
        return "mtp" if self.mtp else "ngram" if self.draft_model is None else "draft"


def confident_top(logits: np.ndarray) -> int | None:
    """The most probable token of ``logits`` (one row, the whole vocabulary), or None when its
    probability is below ``P_MIN``: where a greedy draft (a draft model's, MTP's) ends."""
    top = int(logits.argmax())
    return top if 1.0 / float(np.exp(logits - logits[top]).sum()) >= P_MIN else None


def greedy_draft(step: Callable[[int | None], np.ndarray | None], limit: int) -> list[int] | None:
    """The greedy draft loop of a draft model and of MTP: up to ``limit`` tokens, each the most
    probable after the one before, ending before a token below ``P_MIN`` (``confident_top``).
    ``step(token)`` decodes ``token`` (None: the first step, the source's own input) and returns
    the logits of the position after it, or None when llama.cpp fails; the draft is then None."""
    draft: list[int] = []
    token = None
    while True:
        logits = step(token)
        if logits is None:
            return None
        token = confident_top(logits)
        if token is None:
            return draft
        draft.append(token)
        if len(draft) == limit:
            return draft


class DraftSource(Protocol):
    """What drafts for every sequence from one shared context (``draft_model.DraftModel``,
    ``mtp.MtpDraft``): up to ``limit`` greedy tokens after ``tokens``, the sequence in KV slot
    ``slot``."""

    def propose(self, slot: int, tokens: list[int], limit: int) -> list[int]: ...


class DraftLength:
    """A sequence's adaptive draft length (module docstring): ``budget(limit)`` is how many
    tokens it may draft this step (0: resting after rejections), ``record(drafted, accepted)``
    tells it how the draft went."""

    __slots__ = ("_max", "_length", "_misses", "_cooldown")

    def __init__(self, draft_max: int) -> None:
        self._max = draft_max
        self._length = min(FIRST_DRAFT, draft_max)
        self._misses = 0
        self._cooldown = 0

    def budget(self, limit: int) -> int:
        if self._cooldown:
            self._cooldown -= 1
            return 0
        return max(0, min(limit, self._length))

    def record(self, drafted: int, accepted: int) -> None:
        if accepted == 0:
            self._misses += 1
            self._cooldown = min(1 << (self._misses - 1), MAX_COOLDOWN)
            self._length = max(MIN_DRAFT, self._length // 2)
        else:
            self._misses = 0
            if accepted == drafted:
                self._length = min(self._max, self._length * 2)

    def finish(self, tokens: list[int], num_prompt: int) -> None:
        """A finished sequence's tokens (``NgramDrafter.finish``; nothing to keep here)."""


class NgramDrafter:
    """One sequence's n-gram drafts. ``propose(tokens, limit, slot)`` returns at most ``limit``
    draft tokens (empty: no source predicts anything, or no draft pays; ``slot`` is unused
    here, a draft model keeps its cache there). ``tokens`` only ever grows between calls.

    Two sources, each evaluated on every token the sequence generates (``draft_cost.py``): the
    sequence itself (prompt lookup: the place being followed, else the longest n-gram match)
    and the engine's ``NgramPool`` of other sequences' generations. The source whose draft has
    the highest expected gain under the engine's measured ``StepCosts`` is sent, and only when
    that gain is at least ``1 + MARGIN``. ``record`` is unused: the drafter learns from the
    tokens themselves. ``finish(tokens, num_prompt)`` gives the pool a finished sequence's
    generation. ``salt``: the request's ``cache_salt``, its part of the pool (``NgramPool``)."""

    __slots__ = ("config", "_costs", "_pool", "_salt", "_maps", "_indexed", "_source", "_source_at", "_rates",
                 "_pending")

    def __init__(self, config: SpeculativeConfig, costs: StepCosts | None = None,
                 pool: NgramPool | None = None, salt: str | None = None) -> None:
        self.config = config
        self._costs = costs if costs is not None else StepCosts()
        # the salt as an int: hashed with the n-grams, it places them the same way in every process
        self._pool = pool
        self._salt = None if salt is None else int.from_bytes(hashlib.blake2b(salt.encode(), digest_size=7).digest())
        # n -> {n-gram: position after its latest occurrence}; holds the n-grams that end
        # before a sequence's last token, so that a continuation exists
        self._maps: dict[int, dict[tuple[int, ...], int]] = {
            n: {} for n in range(config.ngram_min, config.ngram_max + 1)}
        self._indexed = 0  # n-grams ending before this position are in the maps
        # the place the last lookup came from: tokens[_source] followed the sequence's last token
        # when it was _source_at tokens long
        self._source: int | None = None
        self._source_at = 0
        # each source's acceptance: "seq" (prompt lookup; after a right prediction the sequence
        # is following a place, after a wrong one a new match is a guess), "pool"
        self._rates = {name: Acceptance() for name in ("seq", "pool")}
        # per source: (sequence length when proposed, proposal, its Acceptance)
        self._pending: dict[str, tuple[int, list[int], Acceptance]] = {}

    def propose(self, tokens: list[int], limit: int, slot: int = 0) -> list[int]:
        self._observe(tokens)
        best: list[int] = []
        gain = 1.0
        for key, (proposal, rate) in self._candidates(tokens).items():
            if not proposal:
                continue
            self._pending[key] = (len(tokens), proposal, rate)
            k, g = best_length(rate, self._costs, min(limit, len(proposal)))
            if k and g > gain:
                best, gain = proposal[:k], g
        return best

    def record(self, drafted: int, accepted: int) -> None:
        """Unused (the class docstring)."""

    def finish(self, tokens: list[int], num_prompt: int) -> None:
        if self._pool is not None:
            self._pool.add(tokens, num_prompt, self._salt)

    def _observe(self, tokens: list[int]) -> None:
        """Compare each pending proposal with the tokens generated since: one observation per
        token, up to the first wrong one."""
        for at, proposal, rate in self._pending.values():
            for i in range(min(len(tokens) - at, len(proposal))):
                hit = tokens[at + i] == proposal[i]
                rate.observe(hit)
                if not hit:
                    break
        self._pending.clear()

    def _candidates(self, tokens: list[int]) -> dict[str, tuple[list[int], Acceptance]]:
        """Each source's proposal (up to ``draft_max`` tokens, empty: none) and its rates; a
        source without one starts afresh (``Acceptance.miss``)."""
        size = self.config.draft_max
        end = len(tokens) - 1
        for e in range(self._indexed, end):
            for n, positions in self._maps.items():
                if e + 1 >= n:
                    positions[tuple(tokens[e + 1 - n:e + 1])] = e + 1
        self._indexed = max(self._indexed, end)
        rates = self._rates
        at = self._followed(tokens)
        if at is None:
            for n in range(self.config.ngram_max, self.config.ngram_min - 1, -1):
                if len(tokens) >= n:
                    at = self._maps[n].get(tuple(tokens[-n:]))
                    if at is not None:
                        break
        self._source, self._source_at = at, len(tokens)
        seq = [] if at is None else tokens[at:at + size]
        pool = self._pool.draft(tokens, size, self._salt) if self._pool is not None else []
        for key, proposal in (("seq", seq), ("pool", pool)):
            if not proposal:
                rates[key].miss()
        return {"seq": (seq, rates["seq"]), "pool": (pool, rates["pool"])}

    def _followed(self, tokens: list[int]) -> int | None:
        """Where the last draft's place has moved to, if the sequence still follows it: the token
        before that place is the sequence's last token (so a one-for-one substitution, such as
        a renamed identifier, keeps the place)."""
        if self._source is None:
            return None
        at = self._source + len(tokens) - self._source_at
        if 1 <= at < len(tokens) and tokens[at - 1] == tokens[-1]:
            return at
        return None


def plan_drafts(chunks: list[Chunk], num_tokens: int, scheduler: Scheduler,
                max_num_batched_tokens: int) -> dict[Sequence, list[int]]:
    """A draft for each decoding sequence of a step (``chunks``, ``num_tokens`` in all) whose
    drafter has one, within the batch's free rows (and, unified layout, the free KV cells),
    ``max_tokens`` and ``n_ctx``: the whole draft plus the token after it must fit, so only a
    step's last token can end a request. None in a step that decodes more than
    ``MAX_DRAFTING_BATCH`` sequences or holds a prompt chunk of more than one token."""
    if sum(chunk.sample for chunk in chunks) > MAX_DRAFTING_BATCH or num_tokens > len(chunks):
        return {}
    room = max_num_batched_tokens - num_tokens
    if not scheduler.split:
        room = min(room, scheduler.kv_free)
    drafts: dict[Sequence, list[int]] = {}
    for chunk in chunks:
        if room < 1:
            break
        seq = chunk.seq
        drafter = seq.payload.drafter
        if not chunk.sample or seq.num_generated == 0 or drafter is None:
            continue
        limit = min(room, seq.payload.request.sampling.max_tokens - seq.num_generated - 1,
                    scheduler.n_ctx - len(seq.tokens) - 1)
        draft = drafter.propose(seq.tokens, limit, seq.slot) if limit > 0 else []
        if draft:
            drafts[seq] = draft
            room -= len(draft)
    return drafts
