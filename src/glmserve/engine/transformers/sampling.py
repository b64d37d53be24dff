"""Per-sequence sampling over torch logits, in llama.cpp's order so both engines agree.

Order as in llama.cpp's ``common/sampling.cpp`` (and ``engine/llama_cpp/sampling.py``): logit
bias, penalties over the generated tokens (repetition: divide positive logits / multiply
negative ones, CTRL-style; frequency and presence: OpenAI's additive penalties), then greedy
(argmax), or top-k -> top-p -> min-p -> temperature -> a draw from the request's own seeded
generator. Filters at their neutral value are skipped.
"""

from __future__ import annotations

import random

import torch

from glmserve.engine.transformers.grammar import TokenMask
from glmserve.engine.types import SamplingParams, TokenLogprob


class Sampler:
    """One request's sampling state: parameters, the counts of generated tokens (for
    penalties), its random generator and its grammar mask (``mask``, None without a grammar).
    ``sample(logits)`` takes a 1-D float tensor of vocabulary size and returns a token id."""

    __slots__ = ("params", "_counts", "_generator", "_bias_ids", "_bias_values", "_penalized", "_plain_greedy",
                 "_mask")

    def __init__(self, params: SamplingParams, n_vocab: int, mask: TokenMask | None = None) -> None:
        self.params = params
        self._mask = mask
        self._counts: dict[int, int] = {}
        self._generator = torch.Generator().manual_seed(
            params.seed & 0xFFFFFFFFFFFFFFFF if params.seed is not None else random.getrandbits(63))
        bias = {t: b for t, b in (params.logit_bias or {}).items() if 0 <= t < n_vocab}
        self._bias_ids = torch.tensor(list(bias), dtype=torch.long) if bias else None
        self._bias_values = torch.tensor(list(bias.values()), dtype=torch.float32) if bias else None
        self._penalized = (params.repetition_penalty != 1.0 or bool(params.frequency_penalty)
                           or bool(params.presence_penalty))
        self._plain_greedy = params.greedy and not bias and not self._penalized and mask is None

    @property
    def plain_greedy(self) -> bool:
        """Greedy with nothing to adjust: the engine may take a whole batch's argmax at once."""
        return self._plain_greedy

    def accept(self, token_id: int) -> None:
        """Record a generated token (counted only when penalties need the counts)."""
        if self._mask is not None:
            self._mask.accept(token_id)
        if self._penalized:
            self._counts[token_id] = self._counts.get(token_id, 0) + 1

    def sample(self, logits: torch.Tensor) -> int:
        p = self.params
        logits = logits.float()
        if self._mask is not None:
            logits = logits.clone()
            self._mask.apply(logits)
        if self._bias_ids is not None:
            logits = logits.clone() if self._mask is None else logits
            logits.index_add_(0, self._bias_ids, self._bias_values)
        if self._counts:
            logits = logits.clone() if self._bias_ids is None else logits
            ids = torch.tensor(list(self._counts), dtype=torch.long)
            counts = torch.tensor(list(self._counts.values()), dtype=torch.float32)
            seen = logits[ids]
            if p.repetition_penalty != 1.0:
                seen = torch.where(seen > 0, seen / p.repetition_penalty, seen * p.repetition_penalty)
            seen = seen - counts * p.frequency_penalty - p.presence_penalty
            logits[ids] = seen
        if p.greedy:
            return int(torch.argmax(logits))
        if p.top_k > 0 and p.top_k < logits.numel():
            kth = torch.topk(logits, p.top_k).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if p.top_p < 1.0:
            sorted_logits, order = torch.sort(logits, descending=True)
            probs = torch.softmax(sorted_logits, dim=-1)
            drop = probs.cumsum(-1) - probs >= p.top_p  # mass before a token already reaches p
            logits = logits.clone()
            logits[order[drop]] = float("-inf")
        if p.min_p > 0.0:
            probs = torch.softmax(logits, dim=-1)
            logits = logits.masked_fill(probs < p.min_p * probs.max(), float("-inf"))
        probs = torch.softmax(logits / max(p.temperature, 1e-6), dim=-1)
        return int(torch.multinomial(probs, 1, generator=self._generator))


def token_logprob(logits: torch.Tensor, token: int, k: int) -> TokenLogprob:
    """``token``'s log-probability under the raw ``logits`` (1-D; log-softmax, no sampling
    adjustment) and the ``k`` most likely tokens."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    top: tuple[tuple[int, float], ...] = ()
    if k:
        values, ids = torch.topk(logprobs, k)
        top = tuple(zip(ids.tolist(), values.tolist()))
    return TokenLogprob(token, float(logprobs[token]), top)
