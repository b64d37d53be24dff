"""Constrained decoding for the transformers engine with xgrammar (the library vLLM's
structured outputs use): the request's GBNF grammar is compiled against the model's vocabulary,
and before each sampled token a per-request ``GrammarMatcher`` masks out every token that would
leave the grammar (``fill_next_token_bitmask`` + ``apply_token_bitmask_inplace``).
"""

from __future__ import annotations

import torch
import xgrammar as xgr

from glmserve.engine.base import GrammarError, one_line


class GrammarCompiler:
    """Compiles GBNF grammars for one tokenizer (compiled grammars are cached by xgrammar).
    ``n_vocab``: the width of the model's logits (it may exceed the tokenizer's size)."""

    def __init__(self, hf_tokenizer, n_vocab: int) -> None:
        self._info = xgr.TokenizerInfo.from_huggingface(hf_tokenizer, vocab_size=n_vocab)
        self._compiler = xgr.GrammarCompiler(self._info, max_threads=1)
        self.n_vocab = n_vocab

    def mask(self, gbnf: str, stop_token_ids: frozenset[int]) -> TokenMask:
        """A fresh mask state for one request; ``stop_token_ids``: the tokens that may end the
        reply once the grammar is complete. Raises ``GrammarError`` when xgrammar rejects the
        grammar."""
        try:
            compiled = self._compiler.compile_grammar(gbnf)
        except (RuntimeError, ValueError) as exc:
            raise GrammarError(f"the grammar does not compile: {one_line(exc)}") from exc
        return TokenMask(xgr.GrammarMatcher(compiled, override_stop_tokens=sorted(stop_token_ids)), self.n_vocab)


class TokenMask:
    """One request's position in its grammar. ``apply(logits)`` masks a 1-D float tensor of
    vocabulary size in place; ``accept(token_id)`` advances past a sampled token."""

    __slots__ = ("_matcher", "_bitmask")

    def __init__(self, matcher: xgr.GrammarMatcher, n_vocab: int) -> None:
        self._matcher = matcher
        self._bitmask = xgr.allocate_token_bitmask(1, n_vocab)

    def apply(self, logits: torch.Tensor) -> None:
        self._matcher.fill_next_token_bitmask(self._bitmask)
        xgr.apply_token_bitmask_inplace(logits.unsqueeze(0), self._bitmask.to(logits.device))

    def accept(self, token_id: int) -> None:
        if not self._matcher.is_terminated():
            self._matcher.accept_token(token_id)
