"""``tests/model_cache.py``: a test model is built once per key and copied from then on."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.model_cache import cached, fixed_home

BUILDS: list[tuple] = []


@cached
def _builder(base: Path, out: Path, word: str, fail: bool = False) -> Path:
    BUILDS.append((base, word))
    out.mkdir()
    (out / "weights.txt").write_text(word + (base / "tokenizer.json").read_text())
    if fail:
        raise RuntimeError("did not learn")
    return out


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GLMSERVE_TEST_CACHE", str(tmp_path / "cache"))
    BUILDS.clear()
    base = tmp_path / "base"
    base.mkdir()
    (base / "tokenizer.json").write_text("{}")
    return tmp_path / "cache", base


def test_a_model_is_built_once_and_copied_after(cache, tmp_path):
    root, base = cache
    first = _builder(base, tmp_path / "a" / "model", "hi")
    second = _builder(base, tmp_path / "b" / "model", word="hi")
    assert len(BUILDS) == 1
    assert (first / "weights.txt").read_text() == (second / "weights.txt").read_text() == "hi{}"
    (second / "weights.txt").write_text("changed by a test")  # a copy: the cached model is untouched
    assert (_builder(base, tmp_path / "c", "hi") / "weights.txt").read_text() == "hi{}"
    assert len(BUILDS) == 1 and len(list(root.iterdir())) == 1


def test_other_inputs_build_anew(cache, tmp_path):
    root, base = cache
    _builder(base, tmp_path / "a", "hi")
    _builder(base, tmp_path / "b", "bye")  # another argument
    (base / "tokenizer.json").write_text('{"v": 2}')  # a file of an argument's folder changed
    assert (_builder(base, tmp_path / "c", "hi") / "weights.txt").read_text() == 'hi{"v": 2}'
    assert len(BUILDS) == 3 and len(list(root.iterdir())) == 3


def test_a_failed_build_leaves_nothing(cache, tmp_path):
    root, base = cache
    with pytest.raises(RuntimeError, match="did not learn"):
        _builder(base, tmp_path / "a", "hi", fail=True)
    assert list(root.iterdir()) == [] and not (tmp_path / "a").exists()


def test_fixed_home_is_the_same_empty_folder_each_time():
    with fixed_home("test-model-cache-home") as home:
        (home / "left").write_text("x")
        first = home
    with fixed_home("test-model-cache-home") as home:
        assert home == first and list(home.iterdir()) == []


@cached(by_content=True)
def _converter(folder: Path, out: Path) -> Path:
    BUILDS.append((folder,))
    out.write_bytes(b"gguf:" + (folder / "model.safetensors").read_bytes()[:8])
    return out


def test_a_file_built_by_content_is_built_anew_for_weights_of_the_same_size(cache, tmp_path, monkeypatch):
    """A converted GGUF is a file, and weights made in a test have the same name and size from
    one build to the next: by content, a large file's bytes count too."""
    monkeypatch.setattr("tests.model_cache.SMALL_FILE", 4)  # the weights below count as large
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"weights1")
    assert _converter(folder, tmp_path / "a" / "m.gguf").read_bytes() == b"gguf:weights1"
    assert _converter(folder, tmp_path / "b" / "m.gguf").read_bytes() == b"gguf:weights1"
    assert len(BUILDS) == 1
    (folder / "model.safetensors").write_bytes(b"weights2")  # same name, same size
    assert _converter(folder, tmp_path / "c" / "m.gguf").read_bytes() == b"gguf:weights2"
    assert len(BUILDS) == 2
