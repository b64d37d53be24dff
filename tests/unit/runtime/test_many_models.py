"""A server of several models over fake engines: requests pick a model by ``model`` and load it
on demand; ``/v1/models`` shows each model's status; ``--max-loaded-models`` unloads the least
recently used idle one; a model that fails to load answers its own requests with a 500 naming
it while the others serve; ``keep_alive: 0``; ``/models/load`` and ``/models/unload``. The
model list itself: ``--models-dir`` scans and ``--config`` files (``runtime/catalog.py``), and
each model's settings (``loaded.model_settings``). End to end with real engines:
tests/e2e/test_many_models.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from glmserve.chat import CHATML_TEMPLATE, ChatTemplate
from glmserve.models import resolve_model
from glmserve.models.keep_alive import parse_keep_alive
from glmserve.runtime.catalog import ConfigError, ModelEntry, read_config, scan_models_dir
from glmserve.runtime.start import model_settings
from glmserve.runtime.loaded import LoadedModel
from glmserve.server import AppOptions, create_app
from glmserve.serving.generation.pipeline import ModelPipeline
from glmserve.runtime.registry import ModelRegistry, ModelSpec
from glmserve.runtime.router import ModelRouter
from glmserve.settings.model import ModelSettings
from glmserve.settings.serve import ServeSettings
from tests.unit.fakes import FakeEngine, one_model


class Farm:
    """Fake loaded models by name: ``loads``/``unloads`` in order; names in ``broken`` fail to load."""

    def __init__(self) -> None:
        self.loads: list[str] = []
        self.unloads: list[str] = []
        self.broken: set[str] = set()

    def spec(self, name: str, embedding_size: int | None = None, **kw) -> ModelSpec:
        def load() -> LoadedModel:
            self.loads.append(name)
            if name in self.broken:
                raise OSError(f"cannot read {name}.gguf")
            engine = FakeEngine(reply=f"I am {name}", embedding_size=embedding_size)
            return LoadedModel.over(ModelPipeline(engine, name, ChatTemplate(CHATML_TEMPLATE)))

        def unload(loaded: LoadedModel) -> None:
            self.unloads.append(name)
            loaded.shutdown()

        return ModelSpec(name, load, unload, **{"metadata": {"engine": "fake"}, **kw})


def _app(farm: Farm, names=("a", "b", "c"), **registry_kw) -> TestClient:
    registry = ModelRegistry([farm.spec(n) for n in names], **registry_kw)
    return TestClient(create_app(ModelRouter(registry, names[0])))


def _ask(http, model: str, **kw):
    return http.post("/v1/chat/completions", json={"model": model, "messages": [{"role": "user", "content": "hi"}],
                                                   **kw})


def _statuses(http) -> dict[str, str]:
    return {card["id"]: card["status"] for card in http.get("/v1/models").json()["data"]}


def test_models_load_on_demand_and_show_their_status():
    farm = Farm()
    with _app(farm) as http:
        assert _statuses(http) == {"a": "unloaded", "b": "unloaded", "c": "unloaded"}
        assert _ask(http, "b").json()["choices"][0]["message"]["content"] == "I am b"
        assert _statuses(http) == {"a": "unloaded", "b": "loaded", "c": "unloaded"}
        card = http.get("/v1/models/b").json()
        assert card["engine"] == "fake" and card["max_model_len"] == 256
        assert _ask(http, "nope").status_code == 404
    assert farm.loads == ["b"] and farm.unloads == ["b"]  # the app's shutdown unloads


def test_max_loaded_models_unloads_the_least_recently_used():
    farm = Farm()
    with _app(farm, max_loaded=2) as http:
        for model in ("a", "b", "a", "c"):
            assert _ask(http, model).status_code == 200
        assert _statuses(http) == {"a": "loaded", "b": "unloaded", "c": "loaded"}
        assert _ask(http, "b").json()["choices"][0]["message"]["content"] == "I am b"
        assert _statuses(http) == {"a": "unloaded", "b": "loaded", "c": "loaded"}
    assert farm.unloads[:2] == ["b", "a"]


def test_a_model_that_fails_to_load_answers_for_itself():
    farm = Farm()
    farm.broken.add("b")
    with _app(farm) as http:
        resp = _ask(http, "b")
        assert resp.status_code == 500
        error = resp.json()["error"]
        assert error["code"] == "model_load_failed" and "model 'b' failed to load: cannot read b.gguf" in error["message"]
        assert _ask(http, "a").status_code == 200
        stream = _ask(http, "c", stream=True)
        assert stream.status_code == 200 and "I am c" in "".join(
            json.loads(line[6:])["choices"][0]["delta"].get("content", "")
            for line in stream.text.splitlines() if line.startswith("data: {") and '"choices":[{' in line)


def test_keep_alive_zero_unloads_after_the_reply():
    farm = Farm()
    with _app(farm) as http:
        assert _ask(http, "b", keep_alive=0).status_code == 200
        assert _statuses(http)["b"] == "unloaded"
        assert _ask(http, "b", keep_alive="10m").status_code == 200
        assert _statuses(http)["b"] == "loaded"
        resp = _ask(http, "b", keep_alive="soon")
        assert resp.status_code == 400 and resp.json()["error"]["param"] == "keep_alive"


def test_keep_alive_needs_an_admin_key_where_there_is_one():
    """A model every key shares is unloaded (``keep_alive: 0``) or pinned (negative) only by an
    admin key, as ``/models/unload`` is (issue 91, 5): another key's ``keep_alive`` is a 403
    and leaves the model as it was, on chat, Messages and Responses."""
    farm = Farm()
    registry = ModelRegistry([farm.spec(n) for n in ("a", "b")])
    app = create_app(ModelRouter(registry, "a"), AppOptions(api_key="user", admin_api_key=("admin",)))
    user, admin = {"Authorization": "Bearer user"}, {"Authorization": "Bearer admin"}
    with TestClient(app) as http:
        assert http.post("/v1/chat/completions", headers=user, json={
            "model": "b", "messages": [{"role": "user", "content": "hi"}]}).status_code == 200
        for path, body in [("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                           ("/v1/messages", {"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}),
                           ("/v1/responses", {"input": "hi"})]:
            refused = http.post(path, headers=user, json={"model": "b", "keep_alive": 0, **body})
            assert refused.status_code == 403 and "admin key" in refused.text, (path, refused.text)
            assert _statuses_with(http, user)["b"] == "loaded"
        assert http.post("/v1/chat/completions", headers=admin, json={
            "model": "b", "keep_alive": 0, "messages": [{"role": "user", "content": "hi"}]}).status_code == 200
        assert _statuses_with(http, admin)["b"] == "unloaded"


def _statuses_with(http, headers) -> dict[str, str]:
    return {card["id"]: card["status"] for card in http.get("/v1/models", headers=headers).json()["data"]}


def test_a_model_served_for_embeddings_only():
    farm = Farm()
    registry = ModelRegistry([farm.spec("a"), farm.spec("vec", embedding_size=8,
                                                         metadata={"engine": "fake", "embedding_only": True})])
    with TestClient(create_app(ModelRouter(registry, "a"))) as http:
        for path, body in [("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                           ("/v1/completions", {"prompt": "hi"}), ("/v1/responses", {"input": "hi"})]:
            resp = http.post(path, json={"model": "vec", **body})
            assert resp.status_code == 400, path
            assert resp.json()["error"]["message"] == "model 'vec' is served for embeddings only (POST /v1/embeddings)"
        resp = http.post("/v1/messages", json={"model": "vec", "max_tokens": 8,
                                               "messages": [{"role": "user", "content": "hi"}]})
        assert resp.status_code == 400 and resp.json()["type"] == "error"  # Anthropic's envelope
        assert farm.loads == []  # refused before loading
        resp = http.post("/v1/embeddings", json={"model": "vec", "input": "hi"})
        assert resp.status_code == 200 and len(resp.json()["data"][0]["embedding"]) == 8
        assert http.get("/v1/models/vec").json()["capabilities"] == ["embedding"]
        assert _ask(http, "a").status_code == 200


def test_load_and_unload_routes():
    farm = Farm()
    with _app(farm) as http:
        assert http.post("/models/load", json={"model": "c"}).json() == {"model": "c", "status": "loaded"}
        assert _statuses(http)["c"] == "loaded"
        assert http.post("/models/unload", json={"model": "c"}).json() == {"model": "c", "status": "unloaded"}
        assert _statuses(http)["c"] == "unloaded"
        assert http.post("/models/load", json={"model": "zzz"}).status_code == 404
        farm.broken.add("a")
        resp = http.post("/models/load", json={"model": "a"})
        assert resp.status_code == 500 and "model 'a' failed to load" in resp.json()["error"]["message"]


def test_one_model_has_no_admin_routes():
    engine = FakeEngine()
    with TestClient(create_app(one_model(ModelPipeline(engine, "fake", ChatTemplate(CHATML_TEMPLATE))))) as http:
        assert http.post("/models/load", json={"model": "fake"}).status_code == 404
        assert http.get("/v1/models").json()["data"][0]["status"] == "loaded"


# ---- the model list and each model's settings ---------------------------------------------


@pytest.mark.parametrize("value, seconds", [(300, 300.0), ("300", 300.0), ("5m", 300.0), ("1h30m", 5400.0),
                                            ("90s", 90.0), ("250ms", 0.25), (0, 0.0), (-1, math.inf), ("-1", math.inf)])
def test_keep_alive_forms(value, seconds):
    assert parse_keep_alive(value) == seconds


@pytest.mark.parametrize("value", ["soon", "5 m", "m", True, [], "nan"])
def test_bad_keep_alive(value):
    with pytest.raises(ValueError):
        parse_keep_alive(value)


def test_models_dir_scan(tmp_path: Path):
    (tmp_path / "glm-4-9b.Q4_K_M.gguf").write_bytes(b"GGUF")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "small.gguf").write_bytes(b"GGUF")
    (tmp_path / "mmproj-glm.gguf").write_bytes(b"GGUF")
    (tmp_path / "hf" / "smol").mkdir(parents=True)
    (tmp_path / "hf" / "smol" / "config.json").write_text("{}")
    (tmp_path / "notes.txt").write_text("x")
    for i in (1, 2, 3):  # a split GGUF: one model, loaded from its first shard
        (tmp_path / "sub" / f"glm-4.6-Q8_0-0000{i}-of-00003.gguf").write_bytes(b"GGUF")
    entries = scan_models_dir(tmp_path)
    assert [(e.name, e.fields["engine"]) for e in entries] == [
        ("glm-4-9b.Q4_K_M", "llama_cpp"), ("hf/smol", "transformers"), ("sub/glm-4.6-Q8_0", "llama_cpp"),
        ("sub/small", "llama_cpp")]
    assert entries[2].fields["model"] == str(tmp_path / "sub" / "glm-4.6-Q8_0-00001-of-00003.gguf")
    (tmp_path / "sub" / "small.gguf").unlink()
    shards = resolve_model(str(tmp_path / "sub"))  # --model FOLDER holding a split GGUF
    assert (shards.path.name, shards.name) == ("glm-4.6-Q8_0-00001-of-00003.gguf", "glm-4.6-Q8_0")
    assert scan_models_dir(tmp_path, "vllm")[1].fields["engine"] == "vllm"
    with pytest.raises(ConfigError, match="not a folder"):
        scan_models_dir(tmp_path / "missing")


def test_config_file(tmp_path: Path):
    path = tmp_path / "models.yaml"
    path.write_text("models:\n"
                    "  - {name: glm, model: /m/glm.gguf, aliases: [glm-4], keep_alive: 10m, n_ctx: 2048}\n"
                    "  - {name: smol, model: /m/smol, engine: transformers, dtype: float32}\n")
    glm, smol = read_config(path)
    assert glm == ModelEntry("glm", {"model": "/m/glm.gguf", "n_ctx": 2048}, ("glm-4",), 600.0)
    assert smol.fields == {"model": "/m/smol", "engine": "transformers", "dtype": "float32"}
    path.write_text("models:\n  - {name: vec, model: /m/vec.gguf, embedding: true}\n")
    assert read_config(path)[0].embedding
    json_path = tmp_path / "models.json"
    json_path.write_text(json.dumps({"models": [{"name": "x", "model": "/m/x.gguf"}]}))
    assert read_config(json_path) == [ModelEntry("x", {"model": "/m/x.gguf"})]


@pytest.mark.parametrize("text, fragment", [
    ("models: 3", "'models' list"),
    ("models:\n  - {model: /m/x.gguf}", "models[0]: name: Field required"),
    ("models:\n  - {name: x}", "models[0] (x): model: Field required"),
    ("models:\n  - {name: x, model: /m/x.gguf, port: 9000}", "port applies to the whole server"),
    ("models:\n  - {name: x, model: /m/x.gguf, keep_alive: soon}", "(x): keep_alive: 'soon' is not a duration"),
    ("models: [unclosed", "not valid YAML"),
    ("models:\n  - {name: x, model: /m/x.gguf, embedding: maybe}", "embedding: Input should be a valid boolean"),
    ("models:\n  - {name: x, model: /m/x.gguf, n_ctxx: 5}", "(x): n_ctxx: not a model setting"),
    ("models:\n  - {name: x, model: /m/x.gguf, served_model_name: y}", "served_model_name: the entry's name"),
    ("models:\n  - 5", "models[0]: Input should be a valid dictionary"),
])
def test_bad_config_files(tmp_path: Path, text, fragment):
    path = tmp_path / "models.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=None) as exc:
        read_config(path)
    assert fragment in str(exc.value)


def test_model_settings_take_the_entry_over_the_flags():
    flags = ServeSettings(n_ctx=1024, n_threads=3, kv_layout="unified", engine="llama_cpp")
    own = model_settings(flags, ModelEntry("smol", {"model": "/m/smol", "engine": "transformers", "n_ctx": 512}))
    assert (own.engine, own.n_ctx, own.n_threads, own.served_model_name) == ("transformers", 512, 3, "smol")
    assert "kv_layout" not in own.model_fields_set  # a llama_cpp flag does not reach a transformers model
    with pytest.raises(ConfigError, match="model 'smol': --kv-layout is not used by the transformers engine"):
        model_settings(flags, ModelEntry("smol", {"model": "/m/smol", "engine": "transformers",
                                                  "kv_layout": "split"}))
    with pytest.raises(ConfigError, match="model 'x': n_ctx"):
        model_settings(flags, ModelEntry("x", {"model": "/m/x.gguf", "n_ctx": -5}))


def test_flags_of_the_model_stay_with_it():
    """--lora, --chat-template, a draft model... given for --model do not reach the other models
    (an adapter or template made for one model does not fit another); the engine's flags are
    their defaults; an entry sets its own."""
    flags = ServeSettings(lora=["sql=/adapters/sql"], chat_template="/t/glm.jinja", tool_call_parser="glm45",
                          served_model_name="glm", override_generation_config={"temperature": 0.6},
                          n_ctx=8192, n_threads=8, max_num_seqs=4)
    own = model_settings(flags, ModelEntry("smol", {"model": "/m/smol.gguf", "engine": "llama_cpp"}))
    assert (own.lora, own.chat_template, own.tool_call_parser, own.override_generation_config) == (
        [], None, "auto", {})
    assert (own.served_model_name, own.n_ctx, own.n_threads, own.max_num_seqs) == ("smol", 8192, 8, 4)
    mine = model_settings(flags, ModelEntry("smol", {"model": "/m/smol.gguf", "lora": ["chat=/adapters/chat"],
                                                     "n_ctx": 2048}))
    assert (mine.lora, mine.n_ctx) == (["chat=/adapters/chat"], 2048)


def test_flags_of_the_model_given_in_the_environment_stay_with_it_too(monkeypatch):
    """The same for --model's own settings given as GLMSERVE_* variables: a --config model is a
    ModelSettings of its entry and the inherited flags, and reads no environment of its own."""
    monkeypatch.setenv("GLMSERVE_CHAT_TEMPLATE", "/t/glm.jinja")
    monkeypatch.setenv("GLMSERVE_LORA", '["sql=/adapters/sql"]')
    monkeypatch.setenv("GLMSERVE_N_THREADS", "3")
    flags = ServeSettings()
    assert (flags.chat_template, flags.lora, flags.n_threads) == ("/t/glm.jinja", ["sql=/adapters/sql"], 3)
    own = model_settings(flags, ModelEntry("smol", {"model": "/m/smol.gguf"}))
    assert type(own) is ModelSettings
    assert (own.chat_template, own.lora, own.n_threads) == (None, [], 3)  # n_threads: inherited, not per-model


def test_one_model_ignores_keep_alive():
    engine = FakeEngine()
    with TestClient(create_app(one_model(ModelPipeline(engine, "fake", ChatTemplate(CHATML_TEMPLATE))))) as http:
        assert _ask(http, "fake", keep_alive=0).status_code == 200
        assert _ask(http, "fake").status_code == 200
        assert http.get("/v1/models").json()["data"][0]["status"] == "loaded"


def test_unloading_the_model_started_before_the_freeze_frees_what_it_held():
    """``loaded.freeze_heap`` (a server's start-up) hides the heap from the collector; the
    unload of the model started then shuts it down and lets the collector see the heap again,
    so that a reference cycle it left behind is freed, not kept for the life of the process."""
    import gc
    import weakref

    from glmserve.runtime import start as runtime_module

    class Held:
        closed = False

        def shutdown(self) -> None:
            self.closed = True

    held = Held()
    held.cycle = held  # freed only by the collector, never by reference counts
    gone = weakref.ref(held)
    try:
        runtime_module.freeze_heap()
        del held
        gc.collect()
        assert gone() is not None  # frozen: a full pass does not see it
        model = Held()
        runtime_module._unload_frozen(model)
        assert model.closed and gone() is None
    finally:
        gc.unfreeze()


def test_a_config_file_gives_server_settings_beside_its_models(tmp_path: Path, monkeypatch):
    """Server settings at the top of ``--config`` (llama-cpp-python's config file layout): used
    where no flag or variable gives them; a model's setting there, or a bad value, is refused."""
    from glmserve.runtime.catalog import with_server_settings
    from glmserve.settings.serve import DeploySettings

    path = tmp_path / "serve.yaml"
    path.write_text("port: 9001\napi_key: [k1, k2]\nmax_loaded_models: 2\n"
                    "models:\n  - {name: x, model: /m/x.gguf}\n")
    settings = with_server_settings(DeploySettings(config=str(path)))
    assert (settings.port, settings.api_key, settings.max_loaded_models) == (9001, ["k1", "k2"], 2)
    assert with_server_settings(DeploySettings(config=str(path), port=8100)).port == 8100  # a flag wins
    assert with_server_settings(DeploySettings()).port == 8000  # no --config: nothing read
    monkeypatch.setenv("GLMSERVE_MAX_LOADED_MODELS", "5")
    assert with_server_settings(DeploySettings(config=str(path))).max_loaded_models == 5  # so does a variable
    for text, fragment in (("n_ctx: 512\n", "n_ctx: not a server setting"),
                           ("config: other.yaml\n", "config: not a server setting"),
                           ("port: many\n", "port: Input should be a valid integer")):
        path.write_text(text + "models: []\n")
        with pytest.raises(ConfigError, match=None) as exc:
            with_server_settings(DeploySettings(config=str(path)))
        assert fragment in str(exc.value), exc.value
