"""``tests/gguf_cache.py``: a folder is converted once per content and copied from then on."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import gguf_cache, hf_models

RUNS: list[tuple] = []


def _convert(folder: Path, out: Path, converter: Path, tokenizer_pre: str = "default") -> Path:
    """A stand-in for llama.cpp's converter: the folder's weights and the options, in a file."""
    RUNS.append((folder, tokenizer_pre))
    out.write_bytes(b"gguf " + tokenizer_pre.encode() + b" " + (folder / "model.safetensors").read_bytes())
    return out


@pytest.fixture
def folder(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("GLMSERVE_TEST_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(hf_models, "converted_gguf", _convert)
    RUNS.clear()
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "model.safetensors").write_bytes(b"weights1")
    (tmp_path / "convert.py").write_text("# converter")
    return hf


def test_a_folder_is_converted_once_and_copied_after(folder, tmp_path):
    converter = tmp_path / "convert.py"
    first = gguf_cache.converted_gguf(folder, tmp_path / "a" / "m.gguf", converter, tokenizer_pre="glm4")
    first.write_bytes(b"changed by a test")  # a copy: the cached file is untouched
    second = gguf_cache.converted_gguf(folder, tmp_path / "b" / "m.gguf", converter, tokenizer_pre="glm4")
    assert second.read_bytes() == b"gguf glm4 weights1" and len(RUNS) == 1
    assert gguf_cache.converted_gguf(folder, tmp_path / "c.gguf", converter).read_bytes() == b"gguf default weights1"
    assert len(RUNS) == 2  # other options: converted anew


def test_weights_of_the_same_name_and_size_are_converted_anew(folder, tmp_path):
    """Weights made in a test have the same name and size from one build to the next: their
    bytes count, however large (the trained models' key counts a large file by its size)."""
    converter = tmp_path / "convert.py"
    gguf_cache.converted_gguf(folder, tmp_path / "a.gguf", converter)
    (folder / "model.safetensors").write_bytes(b"weights2")
    assert gguf_cache.converted_gguf(folder, tmp_path / "b.gguf", converter).read_bytes() == b"gguf default weights2"
    (tmp_path / "convert.py").write_text("# another converter")
    gguf_cache.converted_gguf(folder, tmp_path / "c.gguf", converter)
    assert len(RUNS) == 3


def test_a_failed_conversion_leaves_nothing(folder, tmp_path, monkeypatch):
    def broken(folder, out, converter, **options):
        out.write_bytes(b"half")
        raise RuntimeError("convert_hf_to_gguf.py failed")

    monkeypatch.setattr(hf_models, "converted_gguf", broken)
    with pytest.raises(RuntimeError, match="failed"):
        gguf_cache.converted_gguf(folder, tmp_path / "a.gguf", tmp_path / "convert.py")
    assert list((tmp_path / "cache").iterdir()) == [] and not (tmp_path / "a.gguf").exists()
