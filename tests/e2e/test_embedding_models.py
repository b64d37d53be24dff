"""Embedding models on the llama_cpp engine, through the official ``openai`` client: tiny random
BERT models converted to GGUF by llama.cpp's own converter (``make install`` extracts it from
the llama-cpp-python source release), one per pooling type, served from one ``--models-dir``
without a generation context (a non-causal GGUF is served for embeddings only). Each gives the
vector transformers' own model gives, pooled as its sentence-transformers config says (CLS, mean,
last token). A chat request to such a model is a 400. The default chat model with
``--runner pooling``: the same vectors as when it also generates, and no chat."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import openai
import pytest

from tests.conftest import RemoteServer

pytest.importorskip("torch")

POOLINGS = ("cls", "mean", "lasttoken")
# [CLS] the cat sat on the mat [SEP], and a longer one, as token ids of the tiny vocabulary
INPUTS = [[2, 5, 6, 7, 8, 5, 9, 3], [2, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 3]]


@pytest.fixture(scope="module")
def berts(tmp_path_factory) -> Path:
    from tests.gguf_cache import converted_gguf
    from tests.hf_models import tiny_bert

    converter = Path(sys.prefix) / "share" / "llama.cpp" / "convert_hf_to_gguf.py"
    assert converter.is_file(), f"{converter} is missing: run `make install` (it extracts llama.cpp's converter)"
    root = tmp_path_factory.mktemp("berts")
    for pooling in POOLINGS:
        converted_gguf(tiny_bert(root / "hf" / pooling, pooling), root / "gguf" / f"bert-{pooling}.gguf", converter)
    return root


@pytest.fixture(scope="module")
def srv(berts):
    server = RemoteServer("--model", str(berts / "gguf" / "bert-cls.gguf"), "--models-dir", str(berts / "gguf"))
    yield server
    server.stop()


def _cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


@pytest.mark.parametrize("pooling", POOLINGS)
def test_each_pooling_type_gives_transformers_vectors(srv, berts, pooling):
    from tests.hf_models import bert_reference

    reply = srv.client().embeddings.create(model=f"bert-{pooling}", input=INPUTS, encoding_format="float")
    assert reply.usage.prompt_tokens == sum(map(len, INPUTS))
    for ids, item in zip(INPUTS, reply.data):
        reference = bert_reference(berts / "hf" / pooling, ids, pooling)
        assert len(item.embedding) == len(reference) == 64
        assert max(abs(x - y) for x, y in zip(item.embedding, reference)) < 1e-4
        others = [bert_reference(berts / "hf" / pooling, ids, p) for p in POOLINGS if p != pooling]
        assert all(_cosine(item.embedding, other) < 0.99 for other in others)  # the pooling shows


def test_an_embedding_model_answers_no_chat(srv):
    cards = {card.id: card.model_extra for card in srv.client().models.list().data}
    assert cards["bert-cls"]["capabilities"] == ["embedding"]
    with pytest.raises(openai.BadRequestError, match="served for embeddings only"):
        srv.client().chat.completions.create(model="bert-mean", messages=[{"role": "user", "content": "hi"}])
    assert srv.client().embeddings.create(model="bert-mean", input=INPUTS[:1]).data  # and it still embeds
    assert "Traceback" not in srv.log()  # the engine without a generation context takes no step


def test_a_chat_model_served_with_runner_pooling(server):
    texts = ["The quick brown fox jumps over the lazy dog.", "def add(a, b):\n    return a + b"]
    model = server.client().models.list().data[0].id
    generating = [d.embedding for d in server.client().embeddings.create(model=model, input=texts).data]
    pooling = RemoteServer("--runner", "pooling")
    try:
        client = pooling.client()
        vectors = [d.embedding for d in client.embeddings.create(model=model, input=texts).data]
        assert max(abs(x - y) for a, b in zip(vectors, generating) for x, y in zip(a, b)) < 1e-5
        with pytest.raises(openai.BadRequestError, match="served for embeddings only"):
            client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
    finally:
        pooling.stop()
