"""``--speculative draft`` parts on the bundled SmolLM2 GGUF: the vocabulary check (a copy with
one token's text changed is refused at start-up) and the draft model's KV bookkeeping (drafts
from a slot whose cells are reused, after rejected tokens or another sequence, are those of a
fresh cache), and its memory counted in the model's estimate."""

from __future__ import annotations


import llama_cpp
import pytest
from llama_cpp._internals import LlamaModel

from glmserve.engine.base import EngineError
from glmserve.engine.llama_cpp.speculative.draft_model import DraftModel, vocab_mismatch
from glmserve.engine.llama_cpp import in_force
from glmserve.engine.llama_cpp.settings import LlamaCppSettings
from glmserve.engine.llama_cpp.loading.memory import memory_estimate
from glmserve.engine.llama_cpp.speculative import SpeculativeConfig
from glmserve.llm import LLM
from glmserve.models import ModelNotFoundError, default_model_path
from tests.gguf_copy import gguf_with_token_text


@pytest.fixture(scope="module")
def model():
    m = LlamaModel(path_model=str(default_model_path()), params=llama_cpp.llama_model_default_params(),
                   verbose=False)
    yield m
    m.close()


@pytest.fixture(scope="module")
def other_vocab(tmp_path_factory):
    return gguf_with_token_text(default_model_path(), tmp_path_factory.mktemp("vocab") / "other.gguf", 1000,
                                "glmserve")


def _draft(model, n_seq_max=2, unified=False) -> DraftModel:
    return DraftModel(default_model_path(), model, 512 * n_seq_max, n_seq_max, unified, 2)


def test_vocab_mismatch_names_the_token(model, other_vocab):
    assert vocab_mismatch(model, model) is None
    other = LlamaModel(path_model=str(other_vocab), params=llama_cpp.llama_model_default_params(), verbose=False)
    try:
        assert vocab_mismatch(model, other) == "token 1000 is 'glmserve', the model's is '()'"
    finally:
        other.close()


def test_start_refuses_a_draft_model_of_another_vocabulary(other_vocab):
    with pytest.raises(EngineError, match="another vocabulary than the model: token 1000"):
        LLM(speculative="draft", draft_model=str(other_vocab), n_threads=1)
    with pytest.raises(ModelNotFoundError, match="--draft-model /nonexistent/draft.gguf: no such file"):
        LLM(speculative="draft", draft_model="/nonexistent/draft.gguf", n_threads=1)


@pytest.mark.parametrize("unified", [False, True])
def test_drafts_from_a_reused_cache_are_those_of_a_fresh_one(model, unified):
    # text the model continues with confidence (p >= P_MIN): counting
    prompt = model.tokenize(b"one, two, three, four, five, six, seven, eight, nine, ten. one, two, three,", True, False)
    other = model.tokenize(b"1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,", True, False)
    reused = _draft(model, unified=unified)
    try:
        first = reused.propose(0, prompt, 8)  # its cells: the prompt and first[:7]
        asked = [
            prompt,  # the same tokens again: first[:7] dropped, the prompt's cells kept
            [*prompt, *first[:5]],  # two draft tokens accepted, the next sampled: new cells decoded
            [*prompt, *first[:2], 13],  # a draft rejected at its third token: later cells dropped
            other,  # another sequence in another slot
            other,  # ... and in slot 0 (a reused slot: nothing but BOS in common)
        ]
        got = [reused.propose(slot, tokens, 6) for slot, tokens in zip((0, 0, 0, 1, 0), asked)]
    finally:
        reused.free()
    want = []
    for tokens in asked:
        fresh = _draft(model, unified=unified)
        try:
            want.append(fresh.propose(0, tokens, 6))
        finally:
            fresh.free()
    assert len(first) == 8 and got[0] == first[:6]
    assert got == want and sum(map(bool, got)) >= 4, got


def test_memory_estimate_counts_the_draft_model():
    """The draft model's file and KV cache (the same layout as the model's) are counted: the
    model drafting for itself takes twice the memory."""
    path = default_model_path()
    settings = in_force(LlamaCppSettings(n_ctx=1024, max_num_seqs=2))
    alone = memory_estimate(path, settings)
    assert alone > path.stat().st_size
    assert memory_estimate(path, settings, SpeculativeConfig(draft_model=path)) == 2 * alone
