"""What an engine is given: its own settings class, never the server's settings (API keys, the
database) nor another engine's flags (``engine.for_engine``, ``engine.settings.narrowed``)."""

from __future__ import annotations

import pytest

import glmserve.engine.llama_cpp as llama_cpp_engine
import glmserve.engine.transformers as transformers_engine
from glmserve.engine import create_engine, for_engine
from glmserve.engine.llama_cpp.settings import LlamaCppSettings
from glmserve.engine.settings import narrowed
from glmserve.engine.transformers.settings import TransformersSettings
from glmserve.settings.model import ModelSettings
from glmserve.settings.serve import ServeSettings


def test_an_engine_gets_its_own_settings_class_with_what_was_given():
    serve = ServeSettings(model="/m/x.gguf", api_key=["sk-secret"], n_threads=3, n_ctx=1024)
    mine = for_engine(serve)
    assert type(mine) is LlamaCppSettings
    assert not hasattr(mine, "api_key") and not hasattr(mine, "database_url")
    assert (mine.model, mine.n_threads, mine.n_ctx) == ("/m/x.gguf", 3, 1024)
    # a default stays told apart from a value given (engines read model_fields_set)
    assert mine.model_fields_set == {"model", "n_threads", "n_ctx"}
    hf = for_engine(ServeSettings(model="/m/x", engine="transformers", dtype="float32"))
    assert type(hf) is TransformersSettings and not hasattr(hf, "n_gpu_layers") and hf.dtype == "float32"


def test_narrowed_keeps_an_instance_of_the_class_itself():
    own = LlamaCppSettings(model="/m/x.gguf")
    assert narrowed(own, LlamaCppSettings) is own
    model = narrowed(ServeSettings(model="/m/x.gguf", port=9000, max_n=4), ModelSettings)
    assert type(model) is ModelSettings and not hasattr(model, "port") and model.max_n == 4


@pytest.mark.parametrize("engine, package", [("llama_cpp", llama_cpp_engine), ("transformers", transformers_engine)])
def test_build_is_given_the_narrowed_settings(monkeypatch, engine, package):
    given = []
    monkeypatch.setattr(package, "build", lambda settings: given.append(settings) or "built")
    assert create_engine(ServeSettings(model="/m/x", engine=engine, api_key=["sk-secret"])) == "built"
    assert type(given[0]) is package.SETTINGS_CLASS and not hasattr(given[0], "api_key")
