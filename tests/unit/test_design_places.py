"""``docs/design.md``'s "Where new things go", checked against the code: every file it names
exists, each row of the endpoint table (``server/endpoints.ENDPOINTS``) is a POST route of the
app that takes the row's request model, and a batch may name exactly the table's endpoints;
a per-model setting (a ``ModelSettings`` field) is a flag and a ``--config`` entry key."""

from __future__ import annotations

import re
from pathlib import Path

from fastapi.testclient import TestClient

from glmserve.chat import CHATML_TEMPLATE, ChatTemplate
from glmserve.engine import ENGINES, engine_settings
from glmserve.flags import _cli_source
from glmserve.runtime.catalog import OWN_FIELDS, ConfigEntry
from glmserve.runtime.start import model_settings
from glmserve.server import create_app
from glmserve.server.endpoints import ENDPOINTS
from glmserve.serving.generation.pipeline import ModelPipeline
from glmserve.settings.model import ModelSettings
from glmserve.settings.serve import DeploySettings, ServeSettings
from tests.unit.fakes import FakeEngine, one_model

ROOT = Path(__file__).resolve().parents[2]
SECTION = (ROOT / "docs" / "design.md").read_text().split("## Where new things go", 1)[1].split("\n## ", 1)[0]


def test_every_file_the_section_names_exists():
    named = set(re.findall(r"`((?:[a-z_]+/)+[a-z_<>]*(?:\.py)?)`", SECTION))
    assert {"server/endpoints.py", "runtime/loaded.py", "settings/model.py", "server/routes/"} <= named
    for path in named:
        if "<name>" in path:  # an engine's package: every engine has it
            assert all((ROOT / "src" / "glmserve" / path.replace("<name>", e)).exists()
                       for e in ("llama_cpp", "transformers", "vllm")), path
        else:
            assert (ROOT / "src" / "glmserve" / path).exists(), path


def test_each_endpoint_row_is_a_route_taking_its_request_model():
    app = create_app(one_model(ModelPipeline(FakeEngine(), "fake", ChatTemplate(CHATML_TEMPLATE))))
    with TestClient(app) as http:
        paths = http.get("/openapi.json").json()["paths"]
    for path, endpoint in ENDPOINTS.items():
        body = paths[path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert body["$ref"].rsplit("/", 1)[1] == endpoint.request.__name__, path
    # a batch names one of the table's endpoints, and only those (a stateless app: past that
    # check, the file is not there)
    with TestClient(app) as http:
        def create(endpoint: str):
            return http.post("/v1/batches", json={"input_file_id": "file-x", "endpoint": endpoint,
                                                  "completion_window": "24h"})

        refused = create("/tokenize")
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "endpoint"
        assert all(path in refused.json()["error"]["message"] for path in ENDPOINTS)
        for path in ENDPOINTS:
            assert create(path).status_code == 404, path


# what a setting needs beside it to be valid (a speculative decoding setting needs --speculative)
COMPANIONS = {**dict.fromkeys(["spec_ngram_min", "spec_ngram_max", "spec_ngram_cost", "spec_draft_max"],
                              {"speculative": "ngram"}),
              **dict.fromkeys(["draft_model", "n_gpu_layers_draft"], {"speculative": "draft", "draft_model": "d.gguf"})}


def test_a_per_model_setting_is_a_flag_and_a_config_key():
    """Each ``ModelSettings`` field is a ``glmserve serve`` flag (the parser's own option list),
    and a ``--config`` entry that gives it, alone, is read and served with it: for an engine's
    field, on an engine that reads it."""
    options = set(_cli_source(ServeSettings).root_parser._option_string_actions)  # what glmserve serve parses
    given = ModelSettings().model_dump(mode="json")
    for name in ModelSettings.model_fields:
        flag = "--" + name.replace("_", "-")
        assert flag in options, name
        if name in {"model", "served_model_name"}:  # an entry's own keys: model, and name (its id)
            continue
        engine = next((e for e in ENGINES if name in engine_settings(e)), "llama_cpp")
        fields = {"name": "m", "model": "x.gguf", "engine": engine, name: given[name], **COMPANIONS.get(name, {})}
        entry = ConfigEntry.model_validate(fields).entry()
        served = model_settings(ServeSettings(), entry)
        assert name in served.model_fields_set and served.model_dump(mode="json")[name] == fields[name], name
    assert set(OWN_FIELDS) <= set(ModelSettings.model_fields)


def test_each_model_concept_is_defined_where_the_table_says():
    """The "one name per concept" table: each class is defined in the file its row names, and
    no other module under ``src/glmserve`` defines a class of that name."""
    text = (ROOT / "docs" / "design.md").read_text()
    rows = re.findall(r"^\| `(\w+)` \| [^|]+ \| `([\w/]+\.py)` \|$", text, re.M)
    assert {name for name, _ in rows} >= {"ModelSpec", "LoadedModel", "ModelPipeline", "ModelRouter", "ModelSettings"}
    src = ROOT / "src" / "glmserve"
    for name, path in rows:
        definers = [p.relative_to(src).as_posix() for p in src.rglob("*.py")
                    if re.search(rf"^class {name}\b", p.read_text(), re.M)]
        assert definers == [path], (name, definers)
