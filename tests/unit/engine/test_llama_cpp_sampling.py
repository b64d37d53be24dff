"""llama_cpp's sampler chains on a decoded batch of the default GGUF: plain greedy decoding (an
argmax over the row's logits, no llama.cpp chain) picks what llama.cpp's own greedy sampler
picks, on real logits and on ties written into them, and a greedy request with a bias or a
penalty still goes through the chain that applies it."""

from __future__ import annotations

import numpy as np
import pytest

llama_cpp = pytest.importorskip("llama_cpp")

from llama_cpp._internals import LlamaModel  # noqa: E402

from glmserve.engine.llama_cpp.sampling import SamplerChain  # noqa: E402
from glmserve.engine.types import SamplingParams  # noqa: E402
from glmserve.models import default_model_path  # noqa: E402

ROWS = 6


@pytest.fixture(scope="module")
def decoded():
    """(ctx, vocab, n_vocab) after one decode of ``ROWS`` prompt tokens, every row with logits."""
    model = LlamaModel(path_model=str(default_model_path()), params=llama_cpp.llama_model_default_params(),
                       verbose=False)
    params = llama_cpp.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_threads, params.n_threads_batch = 256, 32, 1, 1
    ctx = llama_cpp.llama_init_from_model(model.model, params)
    vocab = llama_cpp.llama_model_get_vocab(model.model)
    batch = llama_cpp.llama_batch_init(ROWS, 0, 1)
    try:
        batch.n_tokens = ROWS
        for i, token in enumerate((504, 3658, 282, 253, 1345, 30)):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = token, i, 1, 1
            batch.seq_id[i][0] = 0
        assert llama_cpp.llama_decode(ctx, batch) == 0
        yield ctx, vocab, llama_cpp.llama_vocab_n_tokens(vocab)
    finally:
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(ctx)
        model.close()


def llama_greedy(ctx, row: int) -> int:
    """llama.cpp's own greedy sampler on ``row`` (the reference)."""
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_greedy())
    try:
        return llama_cpp.llama_sampler_sample(chain, ctx, row)
    finally:
        llama_cpp.llama_sampler_free(chain)


def row_logits(ctx, row: int, n_vocab: int) -> np.ndarray:
    """Row ``row``'s logits as a writable view of llama.cpp's buffer."""
    return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, row), shape=(n_vocab,))


def test_plain_greedy_picks_llama_cpps_greedy_token_on_every_row(decoded):
    ctx, vocab, n_vocab = decoded
    chain = SamplerChain(SamplingParams(16, temperature=0.0), vocab, n_vocab, 64)
    try:
        picked = [chain.sample(ctx, row) for row in range(ROWS)]
    finally:
        chain.free()
    assert picked == [llama_greedy(ctx, row) for row in range(ROWS)]
    assert len(set(picked)) > 1  # rows of different tokens: a row index that is ignored would show


def test_a_tie_goes_to_the_lowest_token_id_as_in_llama_cpp(decoded):
    ctx, vocab, n_vocab = decoded
    logits = row_logits(ctx, 2, n_vocab)
    saved = logits.copy()
    try:
        top = float(logits.max()) + 5.0
        logits[[9000, 17, 40000]] = top  # three tokens tie for the highest logit
        chain = SamplerChain(SamplingParams(16, temperature=0.0), vocab, n_vocab, 64)
        try:
            assert chain.sample(ctx, 2) == llama_greedy(ctx, 2) == 17
        finally:
            chain.free()
    finally:
        logits[:] = saved


def test_greedy_with_a_bias_or_a_penalty_goes_through_the_chain(decoded):
    ctx, vocab, n_vocab = decoded
    best = llama_greedy(ctx, 4)
    runner_up = int(np.argsort(-row_logits(ctx, 4, n_vocab), kind="stable")[1])
    for params in (SamplingParams(16, temperature=0.0, logit_bias={best: -100.0}),
                   SamplingParams(16, temperature=0.0, logit_bias={runner_up: 100.0}, repetition_penalty=1.1)):
        chain = SamplerChain(params, vocab, n_vocab, 64)
        try:
            assert chain.sample(ctx, 4) == runner_up
        finally:
            chain.free()


def test_a_row_without_logits_is_an_error_not_a_read_of_address_zero(decoded):
    ctx, vocab, n_vocab = decoded
    chain = SamplerChain(SamplingParams(16, temperature=0.0), vocab, n_vocab, 64)
    try:
        with pytest.raises(RuntimeError, match="no logits for batch row 99"):
            chain.sample(ctx, 99)
    finally:
        chain.free()
