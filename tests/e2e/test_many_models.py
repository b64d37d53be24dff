"""A server of several models through the official ``openai`` client: ``--models-dir`` holding
the bundled GGUF under two names, the converted Hugging Face folder (transformers engine) and a
broken file, beside ``--model``. Requests pick a model and load it on demand (once for
concurrent first requests); ``--max-loaded-models`` unloads the least recently used idle one
(``/v1/models`` and the log show it) and every model keeps answering; the broken model answers
its own requests with a 500 naming it; ``keep_alive: 0`` unloads after the reply; the
``/models/load`` and ``/models/unload`` routes."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from glmserve.models import default_model_path
from tests.conftest import DEFAULT_MODEL, RemoteServer

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory, smollm2_hf):
    root = tmp_path_factory.mktemp("models")
    (root / "alpha.gguf").symlink_to(default_model_path())
    (root / "beta.gguf").symlink_to(default_model_path())
    (root / "smol-hf").symlink_to(smollm2_hf, target_is_directory=True)
    (root / "broken.gguf").write_bytes(b"GGUF but not really a model file")
    return root


@pytest.fixture(scope="module")
def srv(models_dir):
    # the transformers model reads --dtype from its own config only: none here, so float32 (auto)
    server = RemoteServer("--models-dir", str(models_dir), "--max-loaded-models", "2", "--n-ctx", "1024")
    yield server
    server.stop()


def _ask(client: openai.OpenAI, model: str, **kw) -> str:
    return client.chat.completions.create(model=model, messages=[{"role": "user", "content": "What is 2 + 2?"}],
                                          temperature=0, max_tokens=12, **kw).choices[0].message.content


def _statuses(srv) -> dict[str, str]:
    return {card.id: card.model_extra["status"] for card in srv.client().models.list().data}


def test_models_are_listed_with_their_status_and_engine(srv):
    cards = {card.id: card.model_extra for card in srv.client().models.list().data}
    assert {name: (c["status"], c["engine"]) for name, c in cards.items()} == {
        DEFAULT_MODEL: ("loaded", "llama_cpp"), "alpha": ("unloaded", "llama_cpp"),
        "beta": ("unloaded", "llama_cpp"), "broken": ("unloaded", "llama_cpp"),
        "smol-hf": ("unloaded", "transformers")}


def test_each_model_answers_and_lru_unloads_under_max_loaded(srv):
    client = srv.client()
    base = _ask(client, DEFAULT_MODEL)
    assert _ask(client, "alpha") == base  # the same weights
    assert _statuses(srv)["alpha"] == "loaded"
    hf = _ask(client, "smol-hf")  # a third model: the least recently used idle one goes
    assert hf
    statuses = _statuses(srv)
    assert statuses["smol-hf"] == "loaded" and list(statuses.values()).count("loaded") == 2
    assert f"unloading model {DEFAULT_MODEL} (to make room for smol-hf)" in srv.log()
    assert _ask(client, DEFAULT_MODEL) == base  # loaded again, same answer


def test_concurrent_first_requests_load_once(srv):
    client = openai.AsyncOpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0, timeout=300)

    async def ask() -> str:
        reply = await client.chat.completions.create(model="beta", temperature=0, max_tokens=8,
                                                     messages=[{"role": "user", "content": "Hi"}])
        return reply.choices[0].message.content

    async def together():
        return await asyncio.gather(*(ask() for _ in range(4)))

    before = srv.log().count("loading model beta")
    answers = asyncio.run(together())
    assert len(set(answers)) == 1 and answers[0]
    assert srv.log().count("loading model beta") == before + 1


def test_a_broken_model_answers_for_itself(srv):
    with pytest.raises(openai.InternalServerError) as exc:
        _ask(srv.client(), "broken")
    assert "model 'broken' failed to load" in str(exc.value)
    assert _ask(srv.client(), "alpha")
    card = {c["id"]: c for c in httpx.get(f"{srv.url}/v1/models").json()["data"]}["broken"]
    assert card["status"] == "unloaded"


def test_keep_alive_zero_and_the_load_routes(srv):
    client = srv.client()
    assert _ask(client, "beta", extra_body={"keep_alive": 0})
    assert _statuses(srv)["beta"] == "unloaded"
    assert httpx.post(f"{srv.url}/models/load", json={"model": "beta"}, timeout=120).json() == {
        "model": "beta", "status": "loaded"}
    assert _statuses(srv)["beta"] == "loaded"
    assert httpx.post(f"{srv.url}/models/unload", json={"model": "beta"}, timeout=120).json() == {
        "model": "beta", "status": "unloaded"}
    assert _statuses(srv)["beta"] == "unloaded"
    assert httpx.post(f"{srv.url}/models/load", json={"model": "nope"}).status_code == 404
    assert "Traceback" not in srv.log()
