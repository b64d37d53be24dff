"""``/v1/embeddings`` over a fake engine: what only the serving layer decides (engines without
embeddings, LoRA adapter names, an engine failure, the base64 format). The vectors themselves are
tested end to end on each engine (``tests/e2e/test_embeddings.py``)."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import struct

import pytest
from fastapi.testclient import TestClient

from glmserve.chat import CHATML_TEMPLATE, ChatTemplate
from glmserve.server import create_app
from glmserve.serving.generation.pipeline import ModelPipeline
from glmserve.protocol.embeddings import EmbeddingRequest
from glmserve.protocol.errors import APIError
from glmserve.serving.embeddings import EmbeddingsService, encode_base64
from tests.unit.fakes import FakeEngine, one_model


def _http(engine: FakeEngine) -> TestClient:
    return TestClient(create_app(one_model(ModelPipeline(engine, "fake", ChatTemplate(CHATML_TEMPLATE)))))


def test_vectors_in_order_with_usage():
    with _http(FakeEngine(embedding_size=4)) as http:
        body = http.post("/v1/embeddings", json={"model": "fake", "input": ["ab", "c"]}).json()
    assert [d["embedding"] for d in body["data"]] == [[2.0, 195.0, 0.0, 0.0], [1.0, 99.0, 0.0, 0.0]]
    assert body["usage"] == {"prompt_tokens": 3, "total_tokens": 3}


def test_engine_without_embeddings_is_a_400():
    with _http(FakeEngine()) as http:
        resp = http.post("/v1/embeddings", json={"model": "fake", "input": "x"})
        assert resp.status_code == 400
        assert resp.json()["error"]["param"] == "model" and "does not serve embeddings" in resp.json()["error"]["message"]
        assert "embedding" not in http.get("/v1/models").json()["data"][0]["capabilities"]


def test_lora_adapter_name_is_a_400():
    with _http(FakeEngine(embedding_size=4, lora_adapters=("pirate",))) as http:
        resp = http.post("/v1/embeddings", json={"model": "pirate", "input": "x"})
    assert resp.status_code == 400 and "'fake'" in resp.json()["error"]["message"]


def test_engine_failure_is_a_500_and_the_next_request_works():
    with _http(FakeEngine(embedding_size=4)) as http:
        resp = http.post("/v1/embeddings", json={"model": "fake", "input": ["fine", "bad!"]})
        assert resp.status_code == 500
        assert resp.json()["error"]["type"] == "server_error" and "llama_decode failed" in resp.json()["error"]["message"]
        assert http.post("/v1/embeddings", json={"model": "fake", "input": "fine"}).status_code == 200


@pytest.mark.parametrize("vector", [[1.0, -2.5, 0.0], [3.4028234663852886e38, 1e-45]])
def test_base64_is_little_endian_float32(vector):
    raw = base64.b64decode(encode_base64(vector))
    assert list(struct.unpack(f"<{len(vector)}f", raw)) == pytest.approx(vector, rel=1e-6, abs=1e-45)


def test_embedding_requests_past_the_engines_capacity_are_a_429():
    """Embeddings are admitted as generations are (issue 91, 4): ``max_num_seqs + max_queue``
    requests at once (the fake's 1 + 1), the next gets the 429 with ``Retry-After``, and a place
    is free again once a request ends, whether it succeeded or failed."""
    gate = asyncio.Event()

    class Held(FakeEngine):
        async def embed(self, token_ids):
            await gate.wait()
            return await super().embed(token_ids)

    engine = Held(embedding_size=4)
    engine.model_info = dataclasses.replace(engine.model_info, max_num_seqs=1, max_queue=1)
    service = EmbeddingsService(ModelPipeline(engine, "fake", ChatTemplate(CHATML_TEMPLATE)))

    def slots():  # the embeddings' count (ModelPipeline.bounded)
        return service.pipeline._gates.get("embeddings")

    async def scenario():
        held = [asyncio.create_task(service.create(EmbeddingRequest(model="fake", input=text))) for text in "ab"]
        while slots() is None or slots().in_flight < 2:
            await asyncio.sleep(0)
        with pytest.raises(APIError) as refused:  # at once (a request admitted would wait for the gate)
            await asyncio.wait_for(service.create(EmbeddingRequest(model="fake", input="c")), 30)
        gate.set()
        done = await asyncio.gather(*held)
        with pytest.raises(APIError):  # a failure frees its place too
            await service.create(EmbeddingRequest(model="fake", input="bad!"))
        after = await service.create(EmbeddingRequest(model="fake", input="c"))
        return refused.value, done, after

    refused, done, after = asyncio.run(scenario())
    assert (refused.status_code, refused.headers) == (429, {"Retry-After": "1"})
    assert len(done) == 2 and after.data[0].embedding[0] == 1.0 and slots().in_flight == 0
