"""Per-sequence llama.cpp sampler chains, so per-token sampling work stays in C.

Order as in llama.cpp's ``common/sampling.cpp``: logit bias, penalties, then greedy, or
top-k -> top-p -> min-p -> temperature -> seeded random draw. Filters at their neutral value are
left out of the chain.
"""

from __future__ import annotations

import ctypes
import random

import llama_cpp

from glmserve.engine.base import GrammarError
from glmserve.engine.types import SamplingParams

_DEFAULT_SEED = 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: llama.cpp picks a random seed


def llama_seed(seed: int | None) -> int:
    """A 32-bit seed; never the value llama.cpp reads as "random"."""
    if seed is None:
        return random.getrandbits(31)
    value = seed & 0xFFFFFFFF
    return value - 1 if value == _DEFAULT_SEED else value


class SamplerChain:
    """Owns one ``llama_sampler`` chain; ``sample(ctx, i)`` samples from the logits of batch
    row ``i`` and records the token (for penalties). ``free()`` releases it."""

    __slots__ = ("_chain",)

    def __init__(self, params: SamplingParams, vocab, n_vocab: int, penalty_last_n: int) -> None:
        """Raises ``GrammarError`` when ``params.grammar`` does not compile."""
        chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        self._chain = chain
        add = lambda smpl: llama_cpp.llama_sampler_chain_add(chain, smpl)  # noqa: E731
        if params.grammar:
            grammar = llama_cpp.llama_sampler_init_grammar(vocab, params.grammar.encode("utf-8"), b"root")
            if not grammar:
                self.free()
                raise GrammarError("the output constraint could not be compiled into a grammar")
            add(grammar)
        if params.logit_bias:
            arr = (llama_cpp.llama_logit_bias * len(params.logit_bias))()
            for i, (token, bias) in enumerate(params.logit_bias.items()):
                arr[i].token, arr[i].bias = token, bias
            add(llama_cpp.llama_sampler_init_logit_bias(n_vocab, len(arr), arr))
        if params.repetition_penalty != 1.0 or params.frequency_penalty or params.presence_penalty:
            add(llama_cpp.llama_sampler_init_penalties(
                n_vocab, penalty_last_n, params.repetition_penalty, params.frequency_penalty, params.presence_penalty))
        if params.greedy:
            add(llama_cpp.llama_sampler_init_greedy())
            return
        if params.top_k > 0:
            add(llama_cpp.llama_sampler_init_top_k(params.top_k))
        if params.top_p < 1.0:
            add(llama_cpp.llama_sampler_init_top_p(params.top_p, 1))
        if params.min_p > 0.0:
            add(llama_cpp.llama_sampler_init_min_p(params.min_p, 1))
        add(llama_cpp.llama_sampler_init_temp(params.temperature))
        add(llama_cpp.llama_sampler_init_dist(llama_seed(params.seed)))

    def sample(self, ctx: ctypes.c_void_p, batch_index: int) -> int:
        return llama_cpp.llama_sampler_sample(self._chain, ctx, batch_index)

    def free(self) -> None:
        if self._chain is not None:
            llama_cpp.llama_sampler_free(self._chain)
            self._chain = None
