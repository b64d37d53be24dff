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
