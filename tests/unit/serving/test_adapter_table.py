"""One LoRA adapter lifecycle for every engine (``serving/adapters.py``), over fake engines that
refuse a request for an adapter they have not loaded (as the real ones do): requests hold
leases; an unload is refused to new requests at once and frees the adapter only after the last
lease, woken by the release (no polling); ``max_loras`` keeps the least recently used adapters
out and loads them again when asked; the table outlives its model's engine (evicted, loaded
again). The same through HTTP and the registry. With real engines: tests/e2e/test_runtime_lora.py."""

from __future__ import annotations

import asyncio
import collections
import threading

import pytest
from fastapi.testclient import TestClient

from glmserve.chat import CHATML_TEMPLATE, ChatTemplate
from glmserve.engine.base import LoRAAdapterError
from glmserve.protocol.errors import APIError
from glmserve.server import AppOptions, create_app
from glmserve.serving.adapters import AdapterTable
from glmserve.serving.chat.service import ChatService
from glmserve.serving.generation.pipeline import ModelPipeline
from glmserve.runtime.registry import ModelRegistry, ModelSpec
from glmserve.runtime.loaded import LoadedModel
from glmserve.runtime.router import ModelRouter
from tests.unit.fakes import FakeEngine, one_model


def _table(max_loras: int = 8, *names: str) -> tuple[AdapterTable, FakeEngine]:
    engine, table = FakeEngine(), AdapterTable(max_loras)
    table.attach(engine)

    async def register() -> None:
        for name in names:
            await table.register(name, f"/adapters/{name}", replace=False)

    asyncio.run(register())
    engine.lora_log.clear()
    return table, engine


def test_unload_waits_for_the_last_lease_and_refuses_new_requests_at_once():
    table, engine = _table(8, "a")

    async def run() -> None:
        first, second = await table.acquire("a"), await table.acquire("a")
        unload = asyncio.create_task(table.unload("a"))
        await asyncio.sleep(0.01)
        assert not unload.done() and "a" not in table.names and engine.lora_log == []
        with pytest.raises(APIError) as refused:
            await table.acquire("a")
        assert refused.value.status_code == 404
        first()
        first()  # a release is idempotent
        await asyncio.sleep(0.01)
        assert not unload.done() and "a" in engine.model_info.lora_adapters  # one request still holds it
        second()
        # woken by the release itself: done within a few turns of the event loop, where a loop
        # polling the leases would still sleep on its timer
        for _ in range(20):
            await asyncio.sleep(0)
        assert unload.done()
        await unload
        assert engine.lora_log == [("unload", "a")] and "a" not in engine.model_info.lora_adapters

    asyncio.run(run())


def test_max_loras_unloads_the_least_recently_used_idle_adapter_and_loads_it_again():
    table, engine = _table(2, "a", "b")

    async def run() -> None:
        (await table.acquire("a"))()  # a used last: b goes first
        await table.register("c", "/adapters/c", replace=False)
        assert engine.lora_log == [("unload", "b"), ("load", "c")]
        assert set(table.names) == {"a", "b", "c"} and table.loaded == ("a", "c")
        release_b = await table.acquire("b")  # registered, not loaded: loaded again, a out
        assert engine.lora_log[2:] == [("unload", "a"), ("load", "b")]
        assert "b" in engine.model_info.lora_adapters and table.loaded == ("c", "b")
        release_b()

    asyncio.run(run())


def test_with_every_loaded_adapter_held_a_request_waits_for_a_release():
    table, engine = _table(1, "a", "b")  # b is loaded, a is not

    async def run() -> None:
        hold_b = await table.acquire("b")
        waiting = asyncio.create_task(table.acquire("a"))
        await asyncio.sleep(0.01)
        assert not waiting.done() and engine.lora_log == []  # b is never unloaded under its request
        hold_b()
        release_a = await asyncio.wait_for(waiting, 1)
        assert engine.lora_log == [("unload", "b"), ("load", "a")]
        release_a()

    asyncio.run(run())


def test_an_adapter_whose_file_is_gone_is_a_400_and_stays_registered():
    table, engine = _table(1, "a", "b")  # b is loaded; a path ending in "misfit" fails to load
    table._paths["a"] = "/adapters/now-misfit"

    async def run() -> None:
        with pytest.raises(APIError) as refused:
            await table.acquire("a")
        assert refused.value.status_code == 400 and "does not match" in refused.value.message

    asyncio.run(run())
    assert "a" in table.names


def _served(table: AdapterTable, max_loaded: int = 1) -> tuple[TestClient, list[FakeEngine]]:
    """Models "base" (with ``table``) and "other" under ``max_loaded``; the engines "base" ran on."""
    engines: list[FakeEngine] = []

    def load_base() -> LoadedModel:
        engine = FakeEngine(reply="I am base")
        engines.append(engine)
        chat = ChatService(ModelPipeline(engine, "base", ChatTemplate(CHATML_TEMPLATE)))
        chat.pipeline.adapter_table = table
        table.attach(engine)
        return LoadedModel.over(chat.pipeline)

    def load_other() -> LoadedModel:
        return LoadedModel.over(ModelPipeline(FakeEngine(reply="I am other"), "other", ChatTemplate(CHATML_TEMPLATE)))

    registry = ModelRegistry([ModelSpec("base", load_base, LoadedModel.shutdown),
                              ModelSpec("other", load_other, LoadedModel.shutdown)], max_loaded=max_loaded)
    app = create_app(ModelRouter(registry, "base", {"base": table}), AppOptions(runtime_lora=True))
    return TestClient(app), engines


def _ask(http, model: str):
    return http.post("/v1/chat/completions", json={"model": model, "messages": [{"role": "user", "content": "hi"}]})


def test_a_runtime_adapter_survives_its_model_being_evicted_and_loaded_again():
    table = AdapterTable()
    http, engines = _served(table)
    with http:
        assert _ask(http, "base").status_code == 200
        loaded = http.post("/v1/load_lora_adapter", json={"lora_name": "tuned", "lora_path": "/adapters/tuned"})
        assert loaded.status_code == 200, loaded.text
        assert _ask(http, "tuned").status_code == 200
        assert _ask(http, "other").status_code == 200  # evicts base (one model loaded at most)
        resp = _ask(http, "tuned")  # base loads again, then the adapter into its new engine
        assert resp.status_code == 200 and resp.json()["model"] == "tuned", resp.text
        assert len(engines) == 2 and engines[1].lora_log == [("load", "tuned")]
        assert engines[1].requests[-1].lora == "tuned"
        assert http.post("/v1/unload_lora_adapter", json={"lora_name": "tuned"}).status_code == 200
        assert _ask(http, "tuned").status_code == 404


def test_a_request_loads_an_adapter_that_max_loras_put_out():
    engine = FakeEngine()
    chat = ChatService(ModelPipeline(engine, "fake", ChatTemplate(CHATML_TEMPLATE)))
    chat.pipeline.adapter_table = AdapterTable(max_loras=1)
    chat.pipeline.adapter_table.attach(engine)
    with TestClient(create_app(one_model(chat), AppOptions(runtime_lora=True))) as http:
        for name in ("a", "b"):
            assert http.post("/v1/load_lora_adapter", json={"lora_name": name, "lora_path": f"/x/{name}"}).status_code == 200
        assert engine.model_info.lora_adapters == ("b",)
        assert [m["id"] for m in http.get("/v1/models").json()["data"]] == ["fake", "a", "b"]
        resp = _ask(http, "a")
        assert resp.status_code == 200 and engine.requests[-1].lora == "a"
        assert engine.model_info.lora_adapters == ("a",) and engine.lora_log[-2:] == [("unload", "b"), ("load", "a")]
        # embeddings and tokenize name no adapter lease: they load nothing
        http.post("/tokenize", json={"model": "b", "prompt": "hi"})
        assert engine.model_info.lora_adapters == ("a",)


def test_vllm_never_runs_the_base_model_under_an_unloaded_adapters_name():
    """The vllm engine's own guard, for a request that reaches it after its adapter was unloaded
    (the serving layer's leases keep this from happening): refused, never run without the adapter."""
    pytest.importorskip("vllm")
    from glmserve.engine.admission import AdmissionControl
    from glmserve.engine.types import GenerationRequest, SamplingParams
    from glmserve.engine.vllm import engine as vllm_engine

    engine = vllm_engine.VllmEngine.__new__(vllm_engine.VllmEngine)
    engine._llm, engine._loop, engine._tasks = object(), None, {}  # started, as far as generate() looks
    engine._lora_requests, engine._lora_in_flight = {}, collections.Counter()
    engine._lora_idle = threading.Condition()
    engine._admission = AdmissionControl(4, None)
    # the moment of the race: check_request saw the adapter listed, its LoRARequest is gone since
    engine.model_info = FakeEngine(lora_adapters=("gone",)).model_info
    engine._sampling_params = lambda sampling: None
    request = GenerationRequest("r1", [1, 2, 3], SamplingParams(max_tokens=4), lora="gone")

    async def run() -> None:
        with pytest.raises(LoRAAdapterError, match="not loaded"):
            engine.generate(request)
        assert engine._admission.in_flight == 0 and engine._tasks == {}

    asyncio.run(run())


def test_a_loaded_adapter_is_leased_while_another_one_loads():
    """The lock serializes engine loads only: a request for a loaded adapter does not wait
    behind another adapter's (slow) load."""
    table, engine = _table(2, "a")
    gate = asyncio.Event()
    load = engine.load_lora_adapter

    async def slow_load(name: str, path: str) -> None:
        await gate.wait()
        await load(name, path)

    engine.load_lora_adapter = slow_load

    async def run() -> None:
        loading = asyncio.create_task(table.register("b", "/adapters/b", replace=False))
        await asyncio.sleep(0.01)
        release_a = await asyncio.wait_for(table.acquire("a"), 0.5)  # while b's load waits at the gate
        assert not loading.done() and table.leases("a") == 1
        release_a()
        gate.set()
        await asyncio.wait_for(loading, 1)
        assert table.loaded == ("a", "b")

    asyncio.run(run())
