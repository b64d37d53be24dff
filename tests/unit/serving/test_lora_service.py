"""Run-time LoRA routes over a fake engine: what the serving layer decides (routes off by
default, the bound on loaded adapters, names taken, ``load_inplace``, unknown names). Loading
into each real engine: tests/e2e/test_runtime_lora.py and the transformers and vllm e2e tests."""

from __future__ import annotations

from fastapi.testclient import TestClient

from glmserve.chat import CHATML_TEMPLATE, ChatTemplate
from glmserve.server import AppOptions, create_app
from glmserve.serving import adapters
from glmserve.serving.generation.pipeline import ModelPipeline
from tests.unit.fakes import FakeEngine, one_model


def _http(runtime_lora: bool = True) -> TestClient:
    engine = FakeEngine()
    return TestClient(create_app(one_model(ModelPipeline(engine, "fake", ChatTemplate(CHATML_TEMPLATE))),
                                 AppOptions(runtime_lora=runtime_lora)))


def _load(http, name, path="/adapters/x", **extra):
    return http.post("/v1/load_lora_adapter", json={"lora_name": name, "lora_path": path, **extra})


def test_routes_are_off_unless_asked():
    with _http(runtime_lora=False) as http:
        assert _load(http, "a").status_code == 404


def test_load_list_unload():
    with _http() as http:
        assert _load(http, "a").text == "Success: LoRA adapter 'a' added successfully."
        assert [m["id"] for m in http.get("/v1/models").json()["data"]] == ["fake", "a"]
        assert http.get("/v1/models/a").json()["parent"] == "fake"
        assert http.post("/v1/unload_lora_adapter", json={"lora_name": "a"}).text == (
            "Success: LoRA adapter 'a' removed successfully.")
        assert [m["id"] for m in http.get("/v1/models").json()["data"]] == ["fake"]
        assert http.get("/v1/models/a").status_code == 404


def test_refusals_and_load_inplace():
    with _http() as http:
        assert _load(http, "a").status_code == 200
        cases = [(_load(http, "a"), 400, "has already been loaded"),
                 (_load(http, "fake"), 400, "base model's name"),
                 (_load(http, "b", "/adapters/misfit"), 400, "does not match"),
                 (_load(http, ""), 400, "lora_name"),
                 (http.post("/v1/unload_lora_adapter", json={"lora_name": "b"}), 404, "cannot be found")]
        for resp, status, fragment in cases:
            assert resp.status_code == status and fragment in resp.json()["error"]["message"], resp.text
        assert _load(http, "a", load_inplace=True).status_code == 200
        assert [m["id"] for m in http.get("/v1/models").json()["data"]] == ["fake", "a"]


def test_number_of_adapters_is_bounded(monkeypatch):
    monkeypatch.setattr(adapters, "MAX_LORA_ADAPTERS", 2)
    with _http() as http:
        assert _load(http, "a").status_code == 200 and _load(http, "b").status_code == 200
        resp = _load(http, "c")
        assert resp.status_code == 400 and "unload one first" in resp.json()["error"]["message"]
        assert _load(http, "b", load_inplace=True).status_code == 200  # a replacement is no new one
