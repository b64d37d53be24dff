"""``/v1/embeddings`` end to end on the llama_cpp engine (the default model) through the official
``openai`` client: vectors of the model's hidden size, unit length, repeatable; several inputs
in one request equal single requests; base64 equals float; token ids equal their text; the
limits and bad input are 400s, and the server keeps serving; embeddings run beside generation
without changing each other."""

from __future__ import annotations

import asyncio
import math

import httpx
import openai
import pytest

from tests.conftest import RemoteServer

HIDDEN_SIZE = 576  # SmolLM2-135M's n_embd
N_CTX, MAX_TOKENS, MAX_INPUTS = 128, 200, 4
TEXTS = ["The quick brown fox jumps over the lazy dog.", "Paris is the capital of France.",
         "def add(a, b):\n    return a + b"]


@pytest.fixture(scope="module")
def srv():
    server = RemoteServer("--n-ctx", str(N_CTX), "--max-embedding-tokens", str(MAX_TOKENS),
                          "--max-embedding-inputs", str(MAX_INPUTS))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def model(srv) -> str:
    return srv.client().models.list().data[0].id


def _embed(srv, model, input, **kwargs) -> list[list[float]]:
    reply = srv.client().embeddings.create(model=model, input=input, encoding_format="float", **kwargs)
    assert [d.index for d in reply.data] == list(range(len(reply.data)))
    return [d.embedding for d in reply.data]


def _max_diff(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def test_vector_shape_norm_and_usage(srv, model):
    reply = srv.client().embeddings.create(model=model, input=TEXTS[0], encoding_format="float")
    vector = reply.data[0].embedding
    assert reply.object == "list" and reply.model == model and reply.data[0].object == "embedding"
    assert len(vector) == HIDDEN_SIZE
    assert math.isclose(math.fsum(x * x for x in vector), 1.0, abs_tol=1e-5)
    count = httpx.post(f"{srv.url}/tokenize", json={"model": model, "prompt": TEXTS[0]}).json()["count"]
    assert reply.usage.prompt_tokens == reply.usage.total_tokens == count


def test_same_text_same_vector_and_texts_differ(srv, model):
    first, again = _embed(srv, model, TEXTS[1])[0], _embed(srv, model, TEXTS[1])[0]
    assert first == again
    other = _embed(srv, model, TEXTS[2])[0]
    assert _max_diff(first, other) > 0.01


def test_batch_equals_single_requests(srv, model):
    together = _embed(srv, model, TEXTS)
    for text, vector in zip(TEXTS, together, strict=True):
        assert _max_diff(vector, _embed(srv, model, text)[0]) < 1e-4


def test_base64_equals_float(srv, model):
    # the openai SDK asks for base64 when encoding_format is not given, and decodes it
    decoded = srv.client().embeddings.create(model=model, input=TEXTS).data
    raw = httpx.post(f"{srv.url}/v1/embeddings", json={"model": model, "input": TEXTS[0],
                                                       "encoding_format": "base64"}).json()
    assert isinstance(raw["data"][0]["embedding"], str)
    for got, want in zip(decoded, _embed(srv, model, TEXTS), strict=True):
        assert _max_diff(got.embedding, want) < 1e-6


def test_token_ids_equal_their_text(srv, model):
    ids = [httpx.post(f"{srv.url}/tokenize", json={"model": model, "prompt": t}).json()["tokens"] for t in TEXTS]
    assert _embed(srv, model, ids[0]) == _embed(srv, model, TEXTS[0])
    assert _embed(srv, model, ids) == _embed(srv, model, TEXTS)


def test_model_card_says_embedding(srv, model):
    card = srv.client().models.retrieve(model)
    assert "embedding" in card.model_extra["capabilities"]


@pytest.mark.parametrize("body, param, fragment", [
    ({"input": ""}, "input", "empty string"),
    ({"input": []}, "input", "must not be empty"),
    ({"input": [[]]}, "input", "input[0] is empty"),
    ({"input": ["text", 1]}, "input.1", "string"),
    ({"input": [49152]}, "input", "not token ids"),
    ({"input": [-1]}, "input", "not token ids"),
    ({"input": "x", "dimensions": 8}, "dimensions", "576"),
    ({"input": "x", "encoding_format": "hex"}, "encoding_format", "base64"),
    ({"input": ["x"] * (MAX_INPUTS + 1)}, "input", f"at most {MAX_INPUTS}"),
    ({"input": "word " * (N_CTX + 10)}, "input", "maximum context length"),
    ({"input": ["word " * 90] * 3}, "input", f"more than {MAX_TOKENS} tokens"),
    ({}, "input", "required"),
])
def test_bad_input_is_400(srv, model, body, param, fragment):
    resp = httpx.post(f"{srv.url}/v1/embeddings", json={"model": model, **body})
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert fragment in error["message"]
    assert _embed(srv, model, "still serving")


def test_unknown_model_is_404(srv):
    with pytest.raises(openai.NotFoundError):
        srv.client().embeddings.create(model="no-such-model", input="x")


def test_dimensions_equal_to_the_model_size_is_accepted(srv, model):
    assert _embed(srv, model, TEXTS[0], dimensions=HIDDEN_SIZE) == _embed(srv, model, TEXTS[0])


def test_beside_generation(srv, model):
    """Embeddings queued while streams generate: the streams finish whole and the vectors equal
    those computed alone."""
    alone = _embed(srv, model, TEXTS)
    client = openai.AsyncOpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0, timeout=120)

    async def stream() -> tuple[str, str]:
        chunks = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Count from one to twenty."}], max_tokens=40,
            temperature=0, stream=True)
        parts = [c async for c in chunks if c.choices]
        return "".join(c.choices[0].delta.content or "" for c in parts), parts[-1].choices[0].finish_reason

    async def embed() -> list[list[float]]:
        reply = await client.embeddings.create(model=model, input=TEXTS, encoding_format="float")
        return [d.embedding for d in reply.data]

    async def run():
        return await asyncio.gather(stream(), stream(), *(embed() for _ in range(4)))

    (text1, reason1), (text2, reason2), *vectors = asyncio.run(run())
    assert text1 and text2 and reason1 in ("stop", "length") and reason2 in ("stop", "length")
    for got in vectors:
        assert all(_max_diff(g, a) < 1e-4 for g, a in zip(got, alone, strict=True))
