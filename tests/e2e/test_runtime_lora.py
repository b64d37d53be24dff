"""LoRA adapters loaded and unloaded at run time (vLLM's ``/v1/load_lora_adapter`` and
``/v1/unload_lora_adapter``, with ``--allow-runtime-lora-updating``) on the llama_cpp engine:
a loaded adapter changes greedy answers and is listed; unloading restores the base answers and
refuses the name; an adapter that does not fit, a missing file and a taken name are 400s; a
stream on an adapter being unloaded finishes whole before the unload answers. The transformers
and vllm engines: tests/e2e/test_transformers_engine.py, test_vllm_engine.py."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from tests.conftest import DEFAULT_MODEL, RemoteServer

pytest.importorskip("peft")

PROMPTS = ["Name a famous painter.", "What is the capital of France?", "List three fruits.", "What is 2 + 2?"]


@pytest.fixture(scope="module")
def misfit_gguf(tmp_path_factory):
    from tests.hf_models import gguf_lora, tiny_llama_lora

    root = tmp_path_factory.mktemp("misfit-gguf")
    return gguf_lora(tiny_llama_lora(root / "adapter", target_modules=("v_proj", "o_proj")), root / "misfit.gguf")


@pytest.fixture(scope="module")
def srv():
    server = RemoteServer("--allow-runtime-lora-updating")
    yield server
    server.stop()


def _answers(srv, model: str) -> list[str]:
    client = srv.client()
    return [client.chat.completions.create(model=model, messages=[{"role": "user", "content": p}], temperature=0,
                                           max_tokens=24).choices[0].message.content for p in PROMPTS]


def _load(srv, name: str, path, **extra) -> httpx.Response:
    return httpx.post(f"{srv.url}/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(path), **extra},
                      timeout=120)


def _unload(srv, name: str) -> httpx.Response:
    return httpx.post(f"{srv.url}/v1/unload_lora_adapter", json={"lora_name": name}, timeout=120)


def _model_ids(srv) -> list[str]:
    return [card.id for card in srv.client().models.list().data]


def test_routes_are_off_by_default(server):
    assert httpx.post(f"{server.url}/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": "/x"}).status_code == 404


def test_load_changes_answers_and_unload_restores_them(srv, gguf_adapter):
    base = _answers(srv, DEFAULT_MODEL)
    resp = _load(srv, "tuned", gguf_adapter)
    assert resp.status_code == 200 and resp.text == "Success: LoRA adapter 'tuned' added successfully."
    assert _model_ids(srv) == [DEFAULT_MODEL, "tuned"]
    assert srv.client().models.retrieve("tuned").parent == DEFAULT_MODEL
    tuned = _answers(srv, "tuned")
    assert all(tuned) and tuned != base
    assert _answers(srv, DEFAULT_MODEL) == base  # the base model beside a loaded adapter
    resp = _unload(srv, "tuned")
    assert resp.status_code == 200 and resp.text == "Success: LoRA adapter 'tuned' removed successfully."
    assert _model_ids(srv) == [DEFAULT_MODEL]
    with pytest.raises(openai.NotFoundError):
        _answers(srv, "tuned")
    assert _answers(srv, DEFAULT_MODEL) == base
    # loaded again (its old prefix caches were dropped with it): the same answers as before
    assert _load(srv, "tuned", gguf_adapter).status_code == 200
    assert _answers(srv, "tuned") == tuned
    assert _load(srv, "tuned", gguf_adapter, load_inplace=True).status_code == 200
    assert _answers(srv, "tuned") == tuned
    assert _unload(srv, "tuned").status_code == 200


def test_refusals(srv, gguf_adapter, misfit_gguf, tmp_path):
    base = _answers(srv, DEFAULT_MODEL)[:1]
    cases = [
        (_load(srv, "bad", misfit_gguf), 400, "does not match the base model"),
        (_load(srv, "missing", tmp_path / "none.gguf"), 400, "no such file"),
        (_load(srv, DEFAULT_MODEL, gguf_adapter), 400, "base model's name"),
        (_unload(srv, "never-loaded"), 404, "cannot be found"),
        (httpx.post(f"{srv.url}/v1/load_lora_adapter", json={"lora_name": "x"}), 400, "lora_path"),
    ]
    assert _load(srv, "once", gguf_adapter).status_code == 200
    cases.append((_load(srv, "once", gguf_adapter), 400, "has already been loaded"))
    for resp, status, fragment in cases:
        assert resp.status_code == status, resp.text
        assert fragment in resp.json()["error"]["message"]
    assert _model_ids(srv) == [DEFAULT_MODEL, "once"]
    assert _unload(srv, "once").status_code == 200
    assert _answers(srv, DEFAULT_MODEL)[:1] == base


def _running(srv) -> float:
    for line in httpx.get(f"{srv.url}/metrics").text.splitlines():
        if line.startswith("glmserve:num_requests_running"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no glmserve:num_requests_running")


def test_unload_waits_for_a_running_stream(srv, gguf_adapter):
    """An unload that arrives while a stream on the adapter runs: the adapter is refused to new
    requests at once, the stream goes on with it to its end (its text equals the same request
    alone), then the unload answers."""
    assert _load(srv, "tuned", gguf_adapter).status_code == 200
    request = dict(model="tuned", messages=[{"role": "user", "content": PROMPTS[0]}], temperature=0, max_tokens=160,
                   extra_body={"ignore_eos": True})
    whole = srv.client().chat.completions.create(**request).choices[0].message.content
    client = openai.AsyncOpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0, timeout=120)

    async def run() -> tuple[str, str | None, httpx.Response]:
        stream = await client.chat.completions.create(**request, stream=True)
        parts, finish, unload = [], None, None
        async for chunk in stream:
            if not chunk.choices:
                continue
            parts.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
            if unload is None:  # the stream has begun: unload its adapter now
                unload = asyncio.create_task(asyncio.to_thread(_unload, srv, "tuned"))
                for _ in range(300):
                    if "tuned" not in await asyncio.to_thread(_model_ids, srv):
                        break
                    await asyncio.sleep(0.1)
                # refused to new requests while this stream still runs (160 tokens take seconds)
                assert "tuned" not in await asyncio.to_thread(_model_ids, srv)
                assert await asyncio.to_thread(_running, srv) == 1
                assert not unload.done()
        return "".join(parts), finish, await unload

    text, finish, resp = asyncio.run(run())
    assert text == whole and finish == "length"
    assert resp.status_code == 200
    assert _model_ids(srv) == [DEFAULT_MODEL]


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    """The default model beside another under --max-loaded-models 1, and one adapter loaded at
    a time (--max-loras 1)."""
    from glmserve.models import default_model_path

    root = tmp_path_factory.mktemp("models")
    (root / "alpha.gguf").symlink_to(default_model_path())
    server = RemoteServer("--allow-runtime-lora-updating", "--models-dir", str(root), "--max-loaded-models", "1",
                          "--max-loras", "1", "--n-ctx", "1024")
    yield server
    server.stop()


def test_an_adapter_outlives_its_models_eviction_and_max_loras(many, gguf_adapter):
    """An adapter loaded at run time answers the same after its model was evicted (another
    model's request, one model loaded at most) and loaded again; with one adapter held in memory
    at a time, two adapters take turns, each loaded again when a request names it."""
    assert _load(many, "tuned", gguf_adapter).status_code == 200
    tuned = _answers(many, "tuned")[:2]
    assert _answers(many, "alpha")[:1]  # evicts the default model, and its adapter with it
    assert _model_ids(many) == [DEFAULT_MODEL, "alpha"]  # unloaded (the adapter is listed when loaded)
    assert _answers(many, "tuned")[:2] == tuned  # the model loads again, then the adapter
    assert "tuned" in _model_ids(many)
    assert _load(many, "second", gguf_adapter).status_code == 200  # puts "tuned" out of memory
    assert _answers(many, "second")[:2] == tuned  # the same file under another name
    assert _answers(many, "tuned")[:2] == tuned  # loaded again from its path
    assert _unload(many, "tuned").status_code == 200 and _unload(many, "second").status_code == 200
    with pytest.raises(openai.NotFoundError):
        _answers(many, "tuned")
