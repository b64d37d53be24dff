"""How the llama_cpp engine reads a GGUF's pooling (``engine/llama_cpp/embedding.py``): the
pooling type llama.cpp's converter writes (``{arch}.pooling_type``, llama.cpp's enum), whether
attention is causal, and when a model is served for embeddings only (``--runner``). The vectors
themselves, against transformers: tests/e2e/test_embedding_models.py."""

from __future__ import annotations

import pytest

from glmserve.engine.base import EngineError

pytest.importorskip("llama_cpp")
from glmserve.engine.llama_cpp.embedding import embeddings_only, model_pooling  # noqa: E402

BERT = {"general.architecture": "bert", "bert.attention.causal": "false"}
LLAMA = {"general.architecture": "llama"}


@pytest.mark.parametrize("value, pooling", [(None, "mean"), ("0", "mean"), ("1", "mean"), ("2", "cls"), ("3", "last")])
def test_pooling_types(value, pooling):
    meta = {**BERT, **({} if value is None else {"bert.pooling_type": value})}
    assert model_pooling(meta) == (pooling, False)
    assert model_pooling(LLAMA) == ("mean", True)


@pytest.mark.parametrize("value, fragment", [("4", "reranker"), ("9", "unknown pooling type 9")])
def test_pooling_types_refused(value, fragment):
    with pytest.raises(EngineError, match=fragment):
        model_pooling({**BERT, "bert.pooling_type": value})


def test_which_models_are_served_for_embeddings_only():
    assert embeddings_only(BERT, "auto", False, False)
    assert not embeddings_only(LLAMA, "auto", False, False)
    assert embeddings_only(LLAMA, "pooling", False, False)
    assert not embeddings_only(LLAMA, "generate", True, True)
    with pytest.raises(EngineError, match="cannot generate"):
        embeddings_only(BERT, "generate", False, False)
    for lora, speculative, flag in ((True, False, "--lora"), (False, True, "--speculative")):
        with pytest.raises(EngineError, match=flag):
            embeddings_only(LLAMA, "pooling", lora, speculative)
