"""Models by name (``models/hub.py``): which names are Hub names, which GGUF files a name and
quantization pick, fetching from a local server of the Hub's API (``tests/hub_site.py``) into a
cache of the test's own, and the one-line errors. End to end (a server started by name, then
offline): ``tests/e2e/test_hub_models.py``."""

from __future__ import annotations

import logging

import pytest

from glmserve.models import ModelNotFoundError, hub
from tests.hub_site import Hub, hub_site

SPLIT = ["Q8_0/m-Q8_0-00002-of-00002.gguf", "Q8_0/m-Q8_0-00001-of-00002.gguf"]
REPO_FILES = ["README.md", "m-Q4_K_M.gguf", "m-IQ2_XXS.gguf", "m-BF16.gguf", "mmproj-m-F16.gguf", *SPLIT]


@pytest.mark.parametrize(("model", "named"), [
    ("unsloth/GLM-4.7-Flash-GGUF:Q4_K_M", ("unsloth/GLM-4.7-Flash-GGUF", "Q4_K_M", None)),
    ("unsloth/GLM-4.7-Flash-GGUF:UD-Q4_K_XL", ("unsloth/GLM-4.7-Flash-GGUF", "UD-Q4_K_XL", None)),
    ("zai-org/GLM-4.5-Air", ("zai-org/GLM-4.5-Air", None, None)),
    ("zai-org/GLM-4.5-Air@v1.0", ("zai-org/GLM-4.5-Air", None, "v1.0")),
    ("o/m-GGUF:IQ4_XS@0123abc", ("o/m-GGUF", "IQ4_XS", "0123abc")),
    ("o/m-GGUF@refs/pr/1:MXFP4_MOE", ("o/m-GGUF", "MXFP4_MOE", "refs/pr/1")),
    ("model.gguf", None), ("models/glm.gguf", None), ("./org/name", None), ("~/models/x", None), ("a/b/c", None), (None, None),
])
def test_which_names_are_hub_names(model, named):
    assert hub.hub_name(model) == named


def test_a_name_and_quant_pick_their_files():
    assert hub.pick_gguf(REPO_FILES, "o/m", None) == ["m-Q4_K_M.gguf"]  # llama-server's default
    assert hub.pick_gguf(REPO_FILES, "o/m", "iq2_xxs") == ["m-IQ2_XXS.gguf"]
    assert hub.pick_gguf(REPO_FILES, "o/m", "Q8_0") == [SPLIT[1], SPLIT[0]]  # every shard, the first first
    assert hub.pick_gguf(["only-Q6_K.gguf", "mmproj-F16.gguf"], "o/m", None) == ["only-Q6_K.gguf"]
    with pytest.raises(ModelNotFoundError, match=r"o/m has no Q5_K_S GGUF; it has: BF16, IQ2_XXS, Q4_K_M, Q8_0$"):
        hub.pick_gguf(REPO_FILES, "o/m", "Q5_K_S")
    with pytest.raises(ModelNotFoundError, match=r"several GGUFs: name one as o/m:QUANT \(one of Q5_K_S, Q6_K\)"):
        hub.pick_gguf(["a-Q6_K.gguf", "a-Q5_K_S.gguf"], "o/m", None)
    with pytest.raises(ModelNotFoundError, match="no .gguf file"):
        hub.pick_gguf(["config.json", "model.safetensors"], "o/m", None)


# unsloth/GLM-4.7-Flash-GGUF's layout: one-file tags at the top, split ones in a folder of their tag
UNSLOTH = ["GLM-4.7-Flash-UD-Q4_K_XL.gguf", "GLM-4.7-Flash-UD-TQ1_0.gguf", "GLM-4.7-Flash-Q4_K_XL.gguf",
           "GLM-4.7-Flash-IQ4_XS.gguf", "GLM-4.7-Flash-MXFP4_MOE.gguf", "GLM-4.7-Flash-Q4_K_M.gguf",
           "BF16/GLM-4.7-Flash-BF16-00002-of-00002.gguf", "BF16/GLM-4.7-Flash-BF16-00001-of-00002.gguf",
           "UD-Q8_K_XL/GLM-4.7-Flash-UD-Q8_K_XL-00001-of-00002.gguf",
           "UD-Q8_K_XL/GLM-4.7-Flash-UD-Q8_K_XL-00002-of-00002.gguf", "mmproj-F16.gguf"]


@pytest.mark.parametrize(("tag", "files"), [
    ("UD-Q4_K_XL", ["GLM-4.7-Flash-UD-Q4_K_XL.gguf"]), ("ud-q4_k_xl", ["GLM-4.7-Flash-UD-Q4_K_XL.gguf"]),
    ("Q4_K_XL", ["GLM-4.7-Flash-Q4_K_XL.gguf"]), ("UD-TQ1_0", ["GLM-4.7-Flash-UD-TQ1_0.gguf"]),
    ("IQ4_XS", ["GLM-4.7-Flash-IQ4_XS.gguf"]), ("mxfp4_moe", ["GLM-4.7-Flash-MXFP4_MOE.gguf"]),
    ("BF16", [UNSLOTH[7], UNSLOTH[6]]), ("UD-Q8_K_XL", [UNSLOTH[8], UNSLOTH[9]]),
    (None, ["GLM-4.7-Flash-Q4_K_M.gguf"]),
])
def test_a_tag_is_what_the_file_name_has_after_the_models_stem(tag, files):
    assert hub.pick_gguf(UNSLOTH, "unsloth/GLM-4.7-Flash-GGUF", tag) == files


def test_a_missing_tag_lists_the_tags_as_they_are_written():
    with pytest.raises(ModelNotFoundError, match=r"^unsloth/GLM-4.7-Flash-GGUF has no UD-Q2_K_XL GGUF; it has: BF16, "
                                                  r"IQ4_XS, MXFP4_MOE, Q4_K_M, Q4_K_XL, UD-Q4_K_XL, UD-Q8_K_XL, "
                                                  r"UD-TQ1_0$"):
        hub.pick_gguf(UNSLOTH, "unsloth/GLM-4.7-Flash-GGUF", "UD-Q2_K_XL")


@pytest.mark.parametrize(("file", "stem", "tag"), [
    ("qwen2.5-7b-instruct-q4_k_m.gguf", "Qwen2.5-7B-Instruct", "q4_k_m"),  # Qwen's lower-case names
    ("THUDM_GLM-4-9B-0414-Q6_K_L.gguf", "THUDM_GLM-4-9B-0414", "Q6_K_L"),  # bartowski's
    ("other-name-UD-IQ1_S.gguf", "GLM-4.6", "UD-IQ1_S"),  # a stem other than the repository's
    ("Q4_K_M/GLM-4.6-Q4_K_M-00001-of-00003.gguf", "GLM-4.6", "Q4_K_M"),
    ("model.gguf", "m", ""),
])
def test_gguf_tags_of_the_hubs_naming_styles(file, stem, tag):
    assert hub.gguf_tag(file, stem) == tag


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """huggingface_hub pointed at the test's hub (set per test) and a cache of its own."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    return tmp_path / "hub"


def _at(monkeypatch, url: str) -> None:
    """As ``HF_ENDPOINT=url`` does at huggingface_hub's import."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", url + "/{repo_id}/resolve/{revision}/{filename}")


def test_a_gguf_is_fetched_once_then_found_offline(cache, monkeypatch, caplog):
    files = {"m-Q4_K_M.gguf": b"GGUF" + b"a" * 300_000, "m-Q8_0.gguf": b"GGUF" + b"b" * 10, "README.md": b"hi"}
    site = Hub({"o/m-GGUF": files}, cut_after=100_000)
    with hub_site(site) as url, caplog.at_level(logging.INFO, "glmserve.hub"):
        _at(monkeypatch, url)
        found = hub.fetch("o/m-GGUF", "llama_cpp")
    path, repo = found.path, found.repo
    assert found.mmproj is None and repo == "o/m-GGUF" and path.read_bytes() == files["m-Q4_K_M.gguf"]
    assert str(path).startswith(str(cache))
    # cut within huggingface_hub's first 10 MiB chunk (nothing kept): fetched again from the start
    # (a resume from a later offset: tests/e2e/test_hub_models.py)
    assert "o/m-GGUF/m-Q4_K_M.gguf" in site.cut
    assert site.gets == [("o/m-GGUF/m-Q4_K_M.gguf", 0), ("o/m-GGUF/m-Q4_K_M.gguf", 0)]
    assert any("downloading" in r.getMessage() and "(100%)" in r.getMessage() for r in caplog.records)
    _at(monkeypatch, "http://127.0.0.1:9")  # nothing listens: the cache alone answers
    assert hub.fetch("o/m-GGUF", "llama_cpp", offline=True) == found
    with pytest.raises(ModelNotFoundError, match=r"o/m-GGUF:Q8_0 is not in the Hugging Face cache \(.*\) and --off"):
        hub.fetch("o/m-GGUF:Q8_0", "llama_cpp", offline=True)


def test_a_folder_is_fetched_without_what_it_does_not_need(cache, monkeypatch):
    files = {"config.json": b"{}", "model.safetensors": b"w", "tokenizer.json": b"{}", "pytorch_model.bin": b"old",
             "model.gguf": b"GGUF"}
    site = Hub({"o/m": files})
    with hub_site(site) as url:
        _at(monkeypatch, url)
        path = hub.fetch("o/m", "transformers").path
        assert sorted(p.name for p in path.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]
        with pytest.raises(ModelNotFoundError, match="picks a GGUF, which the vllm engine does not load"):
            hub.fetch("o/m:Q4_K_M", "vllm")


def test_a_vision_gguf_comes_with_its_projector(cache, monkeypatch):
    files = {"v-Q4_K_M.gguf": b"GGUF-model", "mmproj-v-BF16.gguf": b"GGUF-bf16", "mmproj-v-F16.gguf": b"GGUF-f16"}
    with hub_site(Hub({"o/v-GGUF": files})) as url:
        _at(monkeypatch, url)
        found = hub.fetch("o/v-GGUF:Q4_K_M", "llama_cpp")
    assert found.path.read_bytes() == b"GGUF-model" and found.mmproj.read_bytes() == b"GGUF-f16"
    _at(monkeypatch, "http://127.0.0.1:9")
    assert hub.fetch("o/v-GGUF:Q4_K_M", "llama_cpp", offline=True) == found


@pytest.mark.parametrize(("model", "engine", "message"), [
    ("o/gated", "transformers", r"^o/gated is gated: accept its terms on the Hub, then set HF_TOKEN"),
    ("o/missing", "transformers", r"^o/missing: no such local folder, nor repository on the Hub \(a private one "
                                  r"needs HF_TOKEN\)$"),
    ("o/m-GGUF:Q2_K", "llama_cpp", r"^o/m-GGUF has no Q2_K GGUF; it has: Q4_K_M$"),
    ("o/m-GGUF@v9", "llama_cpp", r"^o/m-GGUF has no revision v9 \(a branch, tag or commit\) on the Hub$"),
    ("o/gated@v1", "transformers", r"^o/gated is gated"),
    ("o/m-GGUF", "transformers", r"^o/m-GGUF has no config.json"),
])
def test_what_cannot_be_fetched_is_said_in_one_line(cache, monkeypatch, model, engine, message):
    site = Hub({"o/m-GGUF": {"m-Q4_K_M.gguf": b"GGUF"}, "o/gated": {"config.json": b"{}"}},
               gated=frozenset({"o/gated"}))
    with hub_site(site) as url:
        _at(monkeypatch, url)
        with pytest.raises(ModelNotFoundError, match=message) as err:
            hub.fetch(model, engine)
    assert "\n" not in str(err.value)


def test_an_unreachable_hub_is_said_so(cache, monkeypatch):
    _at(monkeypatch, "http://127.0.0.1:9")
    with pytest.raises(ModelNotFoundError, match=r"^o/m is not in the Hugging Face cache \(.*\) and the Hub "
                                                  r"\(http://127.0.0.1:9\) cannot be reached \(ConnectError\)$"):
        hub.fetch("o/m", "transformers")


def test_glmserve_models_lists_the_cache_and_the_models_dirs(cache, monkeypatch, tmp_path, capsys):
    from glmserve import cli

    with hub_site(Hub({"o/m-GGUF": {"m-Q4_K_M.gguf": b"G" * (3 << 20)}, "o/f": {"config.json": b"{}"}})) as url:
        _at(monkeypatch, url)
        hub.fetch("o/m-GGUF", "llama_cpp")
        hub.fetch("o/f", "vllm")
    models_dir = tmp_path / "models"
    models_dir.mkdir()
    (models_dir / "local.gguf").write_bytes(b"G" * (1 << 20))
    assert cli.main(["models", "--models-dir", str(models_dir)]) == 0
    lines = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert [line[:3] for line in lines] == [["o/f", "folder", "0.0"], ["o/m-GGUF", "gguf", "3.0"],
                                            ["local", "gguf", "1.0"]]
    assert lines[0][-3:] == ["Hugging", "Face", "cache"] and lines[2][-1] == str(models_dir)


def test_a_revision_pins_the_files_fetched(cache, monkeypatch):
    site = Hub({"o/m-GGUF": {"m-Q4_K_M.gguf": b"GGUF-main"}, "o/f": {"config.json": b'{"v": 2}'}},
               revisions={"o/m-GGUF": {"v1": {"m-Q4_K_M.gguf": b"GGUF-v1"}}, "o/f": {"v1": {"config.json": b"{}"}}})
    with hub_site(site) as url:
        _at(monkeypatch, url)
        assert hub.fetch("o/m-GGUF@v1", "llama_cpp").path.read_bytes() == b"GGUF-v1"
        assert hub.fetch("o/m-GGUF", "llama_cpp", revision="v1").path.read_bytes() == b"GGUF-v1"
        assert hub.fetch("o/m-GGUF:q4_k_m", "llama_cpp").path.read_bytes() == b"GGUF-main"
        commit = site.sha("o/f", site.revisions["o/f"]["v1"])
        assert (hub.fetch(f"o/f@{commit}", "vllm").path / "config.json").read_bytes() == b"{}"
        assert (hub.fetch("o/f", "vllm").path / "config.json").read_bytes() == b'{"v": 2}'
    _at(monkeypatch, "http://127.0.0.1:9")
    assert hub.fetch("o/m-GGUF:Q4_K_M@v1", "llama_cpp", offline=True).path.read_bytes() == b"GGUF-v1"
    with pytest.raises(ModelNotFoundError, match=r"^--revision v1 picks a version of a model by name \(ORG/NAME\); "
                                                  r"x.gguf is not one$"):
        hub.fetch("x.gguf", "llama_cpp", revision="v1")


@pytest.mark.parametrize("status", [429, 500, 503])
def test_a_hub_in_trouble_serves_what_the_cache_holds(cache, monkeypatch, caplog, status):
    site = Hub({"o/m-GGUF": {"m-Q4_K_M.gguf": b"GGUF-model", "mmproj-F16.gguf": b"GGUF-proj"},
                "o/f": {"config.json": b"{}", "model.safetensors": b"w"}})
    with hub_site(site) as url:
        _at(monkeypatch, url)
        fetched = hub.fetch("o/m-GGUF", "llama_cpp"), hub.fetch("o/f", "transformers")
        site.outage = status
        with caplog.at_level(logging.WARNING, "glmserve.hub"):
            assert (hub.fetch("o/m-GGUF", "llama_cpp"), hub.fetch("o/f", "transformers")) == fetched
        assert site.refused == 2  # one request each, no retries
        warnings = [r.getMessage() for r in caplog.records if r.name == "glmserve.hub"]
        assert len(warnings) == 2 and all(f"the Hub ({url}) answers {status}: serving o/" in w for w in warnings)
        with pytest.raises(ModelNotFoundError, match=rf"^o/other is not in the Hugging Face cache \(.*\) and the Hub "
                                                      rf"\({url}\) answers {status}$"):
            hub.fetch("o/other", "transformers")
        with pytest.raises(ModelNotFoundError, match=r"^o/m-GGUF:Q8_0 is not in the Hugging Face cache"):
            hub.fetch("o/m-GGUF:Q8_0", "llama_cpp")


def test_an_unreachable_hub_serves_what_the_cache_holds(cache, monkeypatch, caplog):
    with hub_site(Hub({"o/m-GGUF": {"m-Q4_K_M.gguf": b"GGUF-model"}})) as url:
        _at(monkeypatch, url)
        found = hub.fetch("o/m-GGUF", "llama_cpp")
    _at(monkeypatch, "http://127.0.0.1:9")
    with caplog.at_level(logging.WARNING, "glmserve.hub"):
        assert hub.fetch("o/m-GGUF", "llama_cpp") == found
    assert "the Hub (http://127.0.0.1:9) cannot be reached (ConnectError): serving o/m-GGUF" in caplog.text


def test_a_download_that_does_not_fit_says_so_before_it_starts(cache, monkeypatch):
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 1000, 1000))
    site = Hub({"o/m-GGUF": {"m-Q4_K_M.gguf": b"G" * 5000}, "o/f": {"config.json": b"{}", "w.safetensors": b"w" * 3000,
                                                                     "old.bin": b"b" * 10**6}})
    with hub_site(site) as url:
        _at(monkeypatch, url)
        with pytest.raises(ModelNotFoundError, match=rf"^o/m-GGUF: the disk is full: {cache} needs 5000 bytes "
                                                      r"\(0.0 GiB\), has 1000 bytes \(0.0 GiB\) free \(free some"):
            hub.fetch("o/m-GGUF", "llama_cpp")
        with pytest.raises(ModelNotFoundError, match=r"^o/f: the disk is full: .* needs 3002 bytes"):
            hub.fetch("o/f", "vllm")  # what it fetches, not old.bin
    assert site.gets == []
