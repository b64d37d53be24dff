"""Per-sequence llama.cpp sampler chains, so per-token sampling work stays in C.

Order as in llama.cpp's ``common/sampling.cpp``: logit bias, penalties, then greedy, or
top-k -> top-p -> min-p -> temperature -> seeded random draw. Filters at their neutral value are
left out of the chain. Plain greedy decoding (no bias, penalties or grammar) is one numpy argmax
over the row's logits instead: the first highest logit, the token llama.cpp's greedy sampler picks,
without the chain's copy of the whole vocabulary into a candidate array each step (SmolLM2's
49152 tokens: ~5-10 against ~50-100 us a token).

A grammar is checked the way ``common_sampler_sample`` checks it: the token is drawn without the
grammar, then only that token is checked against it; when the grammar rejects it, the grammar
masks the whole vocabulary and the token is drawn again. Masking the vocabulary at every step
about doubles the time per token on a small model (SmolLM2: ~22 against ~11 ms). A grammar lets
the vocabulary's end-of-generation tokens end a sequence where it is complete; the request's
other stop tokens (GLM's ``<|observation|>`` after a call, which a GGUF need not mark as one)
end it there too, else a model that ends its turn after a forced call would be made to write
another.
"""

from __future__ import annotations

import ctypes
import math
import random

import llama_cpp
import numpy as np

from glmserve.engine.base import GrammarError
from glmserve.engine.types import SamplingParams, TokenLogprob

_DEFAULT_SEED = 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: llama.cpp picks a random seed
# llama_token_data as numpy sees it: {int32 id; float logit; float p}
_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


def llama_seed(seed: int | None) -> int:
    """A 32-bit seed; never the value llama.cpp reads as "random"."""
    if seed is None:
        return random.getrandbits(31)
    value = seed & 0xFFFFFFFF
    return value - 1 if value == _DEFAULT_SEED else value


class SamplerChain:
    """Owns one ``llama_sampler`` chain (and a grammar sampler beside it); ``sample(ctx, i)``
    samples from the logits of batch row ``i`` and records the token (for penalties and the
    grammar). ``free()`` releases them."""

    __slots__ = ("_chain", "_grammar", "_n_vocab", "_candidates", "_view", "_one", "_stops", "_eog", "_row")

    def __init__(self, params: SamplingParams, vocab, n_vocab: int, penalty_last_n: int,
                 stop_ids: frozenset[int] = frozenset()) -> None:
        """``stop_ids``: the tokens that end the request (``rules.stop_token_ids``). Raises
        ``GrammarError`` when ``params.grammar`` does not compile."""
        chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        self._chain, self._grammar, self._n_vocab = chain, None, n_vocab
        self._stops = stop_ids
        # plain greedy: the argmax of the row's logits (a ctypes array type of one row), no chain
        self._row = (ctypes.c_float * n_vocab) if params.greedy and not (
            params.grammar or params.logit_bias or params.repetition_penalty != 1.0 or params.frequency_penalty
            or params.presence_penalty) else None
        # an end-of-generation token: the grammar accepts it where the output may end
        self._eog = next((i for i in sorted(stop_ids) if llama_cpp.llama_vocab_is_eog(vocab, i)), None)
        add = lambda smpl: llama_cpp.llama_sampler_chain_add(chain, smpl)  # noqa: E731
        if params.grammar:
            self._grammar = llama_cpp.llama_sampler_init_grammar(vocab, params.grammar.encode("utf-8"), b"root")
            if not self._grammar:
                self.free()
                raise GrammarError("the output constraint could not be compiled into a grammar")
            self._candidates = (llama_cpp.llama_token_data * n_vocab)()
            self._view = np.frombuffer(self._candidates, dtype=_TOKEN_DATA)
            self._view["id"] = np.arange(n_vocab, dtype=np.int32)
            self._one = (llama_cpp.llama_token_data * 1)()
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
        if self._row is not None:
            logits = llama_cpp.llama_get_logits_ith(ctx, batch_index)
            if not logits:  # llama.cpp logged why (a row without logits)
                raise RuntimeError(f"no logits for batch row {batch_index}")
            address = ctypes.cast(logits, ctypes.c_void_p).value
            return int(np.frombuffer(self._row.from_address(address), dtype=np.float32).argmax())
        if self._grammar is None:
            return llama_cpp.llama_sampler_sample(self._chain, ctx, batch_index)
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, batch_index), shape=(self._n_vocab,))
        token = self._draw(logits, with_grammar=False)
        if not self._grammar_accepts(token):
            if token in self._stops and self._eog is not None and self._grammar_accepts(self._eog):
                llama_cpp.llama_sampler_accept(self._chain, token)  # a stop token where the output may end
                return token
            token = self._draw(logits, with_grammar=True)
        llama_cpp.llama_sampler_accept(self._grammar, token)
        llama_cpp.llama_sampler_accept(self._chain, token)
        return token

    def _draw(self, logits: np.ndarray, with_grammar: bool) -> int:
        view = self._view
        view["logit"] = logits
        view["p"] = 0.0
        view["id"] = np.arange(self._n_vocab, dtype=np.int32)  # the samplers may have reordered it
        cur = llama_cpp.llama_token_data_array(self._candidates, self._n_vocab, -1, False)
        if with_grammar:
            llama_cpp.llama_sampler_apply(self._grammar, ctypes.byref(cur))
        llama_cpp.llama_sampler_apply(self._chain, ctypes.byref(cur))
        return int(self._candidates[cur.selected].id)

    def _grammar_accepts(self, token: int) -> bool:
        self._one[0].id, self._one[0].logit, self._one[0].p = token, 1.0, 0.0
        one = llama_cpp.llama_token_data_array(self._one, 1, -1, False)
        llama_cpp.llama_sampler_apply(self._grammar, ctypes.byref(one))
        return self._one[0].logit != -math.inf

    def free(self) -> None:
        if self._chain is not None:
            llama_cpp.llama_sampler_free(self._chain)
            self._chain = None
        if self._grammar is not None:
            llama_cpp.llama_sampler_free(self._grammar)
            self._grammar = None


def token_logprob(ctx: ctypes.c_void_p, batch_index: int, n_vocab: int, token: int, k: int) -> TokenLogprob:
    """``token``'s log-probability in batch row ``batch_index``'s raw logits (log-softmax, no
    sampling adjustment) and the ``k`` most likely tokens."""
    logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, batch_index), shape=(n_vocab,))
    peak = float(logits.max())
    lse = peak + math.log(float(np.exp(logits - peak, dtype=np.float64).sum()))
    top: tuple[tuple[int, float], ...] = ()
    if k:
        best = np.argpartition(-logits, k - 1)[:k]
        best = best[np.argsort(-logits[best], kind="stable")]
        top = tuple((int(i), float(logits[i]) - lse) for i in best)
    return TokenLogprob(token, float(logits[token]) - lse, top)
