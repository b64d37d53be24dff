"""GGUF metadata glmserve corrects at load (``engine/llama_cpp/loading/metadata.py``): a GLM-4.7-Flash
GGUF (``deepseek2`` with GLM's pre-tokenizer) that does not name its expert gating is routed with
sigmoid; DeepSeek's own GGUFs, and GGUFs that name their gating, are loaded as they are. The
e2e test ``tests/e2e/test_glm_gguf.py`` shows the difference: without the override, the
converted tiny GLM-4.7-Flash decodes other tokens than transformers."""

from __future__ import annotations

import pytest

pytest.importorskip("llama_cpp")

from glmserve.engine.llama_cpp.loading.metadata import SIGMOID, model_params, overrides  # noqa: E402
from glmserve.models import default_model_path  # noqa: E402

GLM47_FLASH = {"general.architecture": "deepseek2", "tokenizer.ggml.pre": "glm4"}


def test_a_glm_47_flash_gguf_without_its_gating_is_routed_with_sigmoid():
    assert overrides(GLM47_FLASH) == {"deepseek2.expert_gating_func": SIGMOID}
    assert overrides({**GLM47_FLASH, "deepseek2.expert_gating_func": "1"}) == {}  # the GGUF says: as it says
    assert overrides({**GLM47_FLASH, "tokenizer.ggml.pre": "deepseek-v3"}) == {}  # DeepSeek's own model
    assert overrides({"general.architecture": "glm4moe", "tokenizer.ggml.pre": "glm4"}) == {}  # sigmoid in llama.cpp


def test_other_ggufs_and_unreadable_files_load_with_the_defaults(tmp_path):
    params, array = model_params(default_model_path())  # SmolLM2: llama
    assert array is None and not params.kv_overrides
    (tmp_path / "broken.gguf").write_bytes(b"not a gguf")
    assert model_params(tmp_path / "broken.gguf")[1] is None
