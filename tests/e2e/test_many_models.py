"""A server of several models through the official ``openai`` client: ``--models-dir`` holding
the bundled GGUF under two names, the converted Hugging Face folder (transformers engine) and a
broken file, beside ``--model``. Requests pick a model and load it on demand (once for
concurrent first requests); ``--max-loaded-models`` unloads the least recently used idle one
(``/v1/models`` and the log show it) and every model keeps answering; the broken model answers
its own requests with a 500 naming it; ``keep_alive: 0`` unloads after the reply; the
``/models/load`` and ``/models/unload`` routes."""

from __future__ import annotations

import asyncio
import re

import httpx
import pexpect
import openai
import pytest

from glmserve.engine import memory_estimate
from glmserve.models import default_model_path
from glmserve.runtime.start import start_model
from glmserve.settings.serve import ServeSettings
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
    server = RemoteServer("--models-dir", str(models_dir), "--max-loaded-models", "1", "--n-ctx", "1024")
    yield server
    server.stop()


def _ask(client: openai.OpenAI, model: str, **kw) -> str:
    return client.chat.completions.create(model=model, messages=[{"role": "user", "content": "What is 2 + 2?"}],
                                          temperature=0, max_tokens=12, **kw).choices[0].message.content


def _statuses(srv) -> dict[str, str]:
    return {card.id: card.model_extra["status"] for card in srv.client().models.list().data}


def _finished(srv, model: str) -> float:
    """Requests ``model`` finished, from ``/metrics``."""
    return sum(float(value) for value in re.findall(
        rf'^glmserve:request_success_total{{[^}}]*model_name="{model}"[^}}]*}} (\S+)$',
        httpx.get(f"{srv.url}/metrics").text, re.M))


def test_models_are_listed_with_their_status_and_engine(srv):
    cards = {card.id: card.model_extra for card in srv.client().models.list().data}
    assert {name: (c["status"], c["engine"]) for name, c in cards.items()} == {
        DEFAULT_MODEL: ("loaded", "llama_cpp"), "alpha": ("unloaded", "llama_cpp"),
        "beta": ("unloaded", "llama_cpp"), "broken": ("unloaded", "llama_cpp"),
        "smol-hf": ("unloaded", "transformers")}


def test_each_model_answers_and_lru_unloads_under_max_loaded(srv):
    client = srv.client()
    base = _ask(client, DEFAULT_MODEL)
    assert _ask(client, "alpha") == base  # the same weights; the second model unloads the first
    assert f"unloading model {DEFAULT_MODEL} (to make room for alpha)" in srv.log()
    assert _statuses(srv) == {DEFAULT_MODEL: "unloaded", "alpha": "loaded", "beta": "unloaded",
                              "broken": "unloaded", "smol-hf": "unloaded"}
    assert _ask(client, "smol-hf")
    assert "unloading model alpha (to make room for smol-hf)" in srv.log()
    statuses = _statuses(srv)
    assert statuses["smol-hf"] == "loaded" and list(statuses.values()).count("loaded") == 1
    assert _ask(client, DEFAULT_MODEL) == base  # loaded again, same answer
    assert _ask(client, "alpha") == base


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


ORIGIN = "http://localhost:3000"


@pytest.fixture(scope="module")
def configured(tmp_path_factory):
    config = tmp_path_factory.mktemp("config") / "models.yaml"
    # a server setting beside the models (llama-cpp-python's config file layout)
    config.write_text(f"allowed_origins: [{ORIGIN}]\n"
                      f"models:\n"
                      f"  - {{name: vec, model: {default_model_path()}, embedding: true, aliases: [text-embedding]}}\n"
                      f"  - {{name: small, model: {default_model_path()}, n_ctx: 512, keep_alive: -1}}\n")
    server = RemoteServer("--config", str(config), "--n-ctx", "1024")
    yield server
    server.stop()


def test_a_config_file_with_an_embedding_model(configured):
    client = configured.client()
    vectors = client.embeddings.create(model="text-embedding", input=["a cat", "a dog"]).data
    assert [len(v.embedding) for v in vectors] == [576, 576]
    with pytest.raises(openai.BadRequestError, match="served for embeddings only"):
        _ask(client, "vec")
    small = client.models.retrieve("small")
    assert _ask(client, "small") and client.models.retrieve("small").model_extra["max_model_len"] == 512
    assert small.model_extra["status"] == "unloaded"
    assert {c.id: c.model_extra["status"] for c in client.models.list().data} == {
        DEFAULT_MODEL: "loaded", "vec": "loaded", "small": "loaded"}


def test_a_config_file_gives_a_server_setting(configured):
    preflight = httpx.options(f"{configured.url}/v1/chat/completions", headers={
        "Origin": ORIGIN, "Access-Control-Request-Method": "POST"})
    assert preflight.headers.get("access-control-allow-origin") == ORIGIN
    other = httpx.options(f"{configured.url}/v1/chat/completions", headers={
        "Origin": "http://elsewhere.example", "Access-Control-Request-Method": "POST"})
    assert "access-control-allow-origin" not in other.headers


def test_the_memory_estimate_is_the_file_and_the_kv_cache_llama_cpp_allocates():
    settings = ServeSettings(n_ctx=512, max_num_seqs=2, n_threads=1)
    loaded = start_model(settings)
    try:
        kv = loaded.engine.kv_cache_bytes
    finally:
        loaded.shutdown()
    assert kv == 2 * 512 * 30 * 2 * 2 * 3 * 64  # split: 2 x 512 cells; 30 layers, K and V, f16, 3 KV heads of 64
    assert memory_estimate(settings) == default_model_path().stat().st_size + kv


def test_the_terminal_chat_picks_a_model(configured):
    from tests.e2e.test_chat_cli import PROMPT, SYSTEM, _spawn
    from tests.e2e.test_chat_cli import _ask as ask_in_terminal

    child = _spawn("--url", configured.url, "--system", SYSTEM)
    try:
        child.sendline("/model")
        child.expect(r"\* " + DEFAULT_MODEL)  # the first listed, chosen when --model is not given
        child.expect(r"  vec  \S*(un)?loaded")
        child.expect(PROMPT)
        child.sendline("/model nope")
        child.expect("no model 'nope'")
        child.expect(PROMPT)
        before = _finished(configured, "small")
        child.sendline("/model small")
        child.expect("chatting with small")
        child.expect(PROMPT)
        assert "Paris" in ask_in_terminal(child, "What is the capital of France?")
        assert _finished(configured, "small") == before + 1  # the reply came from the model picked
        child.sendline("/exit")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
