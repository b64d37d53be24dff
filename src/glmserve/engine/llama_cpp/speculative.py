"""Speculative decoding for the llama_cpp engine: n-gram drafts (prompt lookup) and their
verification rule.

Drafting (prompt lookup decoding, Saxena 2023; vLLM's ``ngram`` method, llama.cpp's
``--spec-type ngram-simple``): the last ``n`` tokens of a sequence (prompt and output so far),
for ``n`` from ``ngram_max`` down to ``ngram_min``, are looked up among its earlier tokens; the
tokens that followed their most recent earlier occurrence are the draft. Input-grounded work
(rewrite this file with one change, repeat this JSON) is drafted right most of the time.

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

Adaptive: a sequence's drafts start short (``FIRST_DRAFT``) and double while wholly accepted,
up to ``draft_max``; a sequence whose draft is rejected at its first token skips drafting for a
number of steps that doubles with each such draft in a row (up to ``MAX_COOLDOWN``), and its
next draft is half as long. A rejected draft costs its rows in the step's batch, so natural
text, where n-grams recur without their continuations, is not slowed down by it.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_COOLDOWN = 16  # steps without drafting after repeated first-token rejections
MIN_DRAFT = 2  # a draft shorter than this costs a batch row and rarely pays
# drafts only in steps that decode at most this many sequences (vLLM's
# speculative_disable_by_batch_size): a CPU step of more is compute-bound, and each draft token
# then costs about what a decoded one does (measured: c=8 0.82 to 0.84x with drafts in every step)
MAX_DRAFTING_BATCH = 2
FIRST_DRAFT = 4  # a sequence's first drafts are this long at most; they double while all accepted


@dataclass(slots=True, frozen=True)
class SpeculativeConfig:
    """``--speculative ngram`` with ``--spec-ngram-min/max`` (n-gram lengths looked up, in
    tokens) and ``--spec-draft-max`` (tokens drafted per sequence and step)."""

    ngram_min: int = 2
    ngram_max: int = 4
    draft_max: int = 16

    def __post_init__(self) -> None:
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError("1 <= spec_ngram_min <= spec_ngram_max required")
        if self.draft_max < 1:
            raise ValueError("spec_draft_max >= 1 required")


@dataclass(slots=True)
class SpecDecodeCounters:
    """vLLM's spec-decode counters (``vllm:spec_decode_num_drafts`` and the rest): drafts
    verified, tokens drafted, drafted tokens accepted."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0

    def add(self, drafted: int, accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += drafted
        self.num_accepted_tokens += accepted

    @property
    def acceptance_rate(self) -> float | None:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else None

    def describe(self) -> str:
        rate = self.acceptance_rate
        return (f"{self.num_drafts} drafts, {self.num_draft_tokens} draft tokens, {self.num_accepted_tokens} "
                f"accepted" + ("" if rate is None else f" (acceptance rate {rate:.1%})"))


class NgramDrafter:
    """One sequence's n-gram index and draft length. ``propose(tokens, limit)`` returns at most
    ``limit`` draft tokens (empty: no match, or resting after rejections); ``record(drafted,
    accepted)`` tells it how the draft went. ``tokens`` only ever grows between calls."""

    __slots__ = ("config", "_maps", "_indexed", "_length", "_misses", "_cooldown")

    def __init__(self, config: SpeculativeConfig) -> None:
        self.config = config
        # n -> {n-gram: position after its latest occurrence}; holds the n-grams that end
        # before a sequence's last token, so that a continuation exists
        self._maps: dict[int, dict[tuple[int, ...], int]] = {
            n: {} for n in range(config.ngram_min, config.ngram_max + 1)}
        self._indexed = 0  # n-grams ending before this position are in the maps
        self._length = min(FIRST_DRAFT, config.draft_max)
        self._misses = 0
        self._cooldown = 0

    def propose(self, tokens: list[int], limit: int) -> list[int]:
        if self._cooldown:
            self._cooldown -= 1
            return []
        limit = min(limit, self._length)
        if limit < 1:
            return []
        end = len(tokens) - 1
        for e in range(self._indexed, end):
            for n, positions in self._maps.items():
                if e + 1 >= n:
                    positions[tuple(tokens[e + 1 - n:e + 1])] = e + 1
        self._indexed = max(self._indexed, end)
        for n in range(self.config.ngram_max, self.config.ngram_min - 1, -1):
            if len(tokens) >= n:
                at = self._maps[n].get(tuple(tokens[-n:]))
                if at is not None:
                    return tokens[at:at + limit]
        return []

    def record(self, drafted: int, accepted: int) -> None:
        if accepted == 0:
            self._misses += 1
            self._cooldown = min(1 << (self._misses - 1), MAX_COOLDOWN)
            self._length = max(MIN_DRAFT, self._length // 2)
        else:
            self._misses = 0
            if accepted == drafted:
                self._length = min(self.config.draft_max, self._length * 2)
