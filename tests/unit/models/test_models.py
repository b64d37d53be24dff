"""``--model`` resolution: the embedded default, .gguf files and folders; never a download."""

from __future__ import annotations

import pytest

from glmserve.models import DEFAULT_MODEL_NAME, ModelNotFoundError, resolve_model


def test_default_model_is_the_bundled_gguf():
    resolved = resolve_model(None)
    assert resolved.name == DEFAULT_MODEL_NAME
    assert resolved.path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert resolved.path.read_bytes()[:4] == b"GGUF"


def test_gguf_file_and_folder(tmp_path):
    f = tmp_path / "tiny-model.Q8_0.gguf"
    f.write_bytes(b"GGUF")
    assert resolve_model(str(f)).name == "tiny-model.Q8_0"
    assert resolve_model(str(tmp_path)).path == f
    (tmp_path / "other.gguf").write_bytes(b"GGUF")
    with pytest.raises(ModelNotFoundError, match="several"):
        resolve_model(str(tmp_path))


@pytest.mark.parametrize("name", ["/no/such/model.gguf", "some-org/some-model"])
def test_missing_model(name):
    with pytest.raises(ModelNotFoundError, match="no such file"):
        resolve_model(name)
