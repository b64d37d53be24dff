"""Models by name, end to end, against a local server of the Hugging Face Hub's API
(``tests/hub_site.py``, through ``HF_ENDPOINT``) and a Hugging Face cache of the test's own
(``HF_HOME``): ``glmserve serve --model ORG/NAME-GGUF:QUANT`` (llama_cpp) and ``--model
ORG/NAME`` (transformers) fetch and answer, a second start answers from the cache while the Hub
answers 503, and with ``--offline`` with no Hub at all, the failures are one line and exit status 1, and ``glmserve pull``
logs its progress and resumes a cut download."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from glmserve.models import default_model_path
from glmserve.testing import RemoteServer
from tests.hub_site import Hub, folder_files, hub_site

GGUF_REPO = "test-org/SmolLM2-135M-Instruct-GGUF"
NOBODY = "http://127.0.0.1:9"  # no Hub listens there
ASK = [{"role": "user", "content": "What is the capital of France?"}]


# the first download of a file is cut after this many bytes; huggingface_hub writes what it
# reads in chunks of 10 MiB (constants.DOWNLOAD_CHUNK_SIZE), so it resumes from the last whole
# chunk before the cut (a cut within the first chunk starts again at 0, nothing having been kept)
CUT = 24 << 20


def _resumed(gets: list[tuple[str, int]], file: str) -> None:
    """``file`` was downloaded twice: from the start, then from an offset past 0 and at most the
    cut (not downloaded whole again)."""
    assert [name for name, _ in gets] == [file, file], gets
    assert gets[0][1] == 0 and 0 < gets[1][1] <= CUT, gets


@pytest.fixture
def gguf_hub() -> Hub:
    """A GGUF repository of two quantizations, named as unsloth names them (the UD-Q8_K_XL
    name holds the embedded model; the Q4_K_M file, the default one, is not a model: fetching it
    would fail the start)."""
    return Hub({GGUF_REPO: {"SmolLM2-135M-Instruct-UD-Q8_K_XL.gguf": default_model_path().read_bytes(),
                            "SmolLM2-135M-Instruct-Q4_K_M.gguf": b"not a model", "README.md": b"# SmolLM2"},
                "test-org/gated": {"config.json": b"{}"}}, gated=frozenset({"test-org/gated"}), cut_after=CUT)


def _answer(srv: RemoteServer, model: str) -> str:
    client = srv.client()
    assert [m.id for m in client.models.list().data] == [model]
    reply = client.chat.completions.create(model=model, messages=ASK, max_tokens=8, temperature=0)
    assert reply.usage.completion_tokens > 0
    return reply.choices[0].message.content


def test_a_gguf_by_name_is_fetched_served_and_served_again_offline(gguf_hub, tmp_path):
    hf_home = str(tmp_path / "hf")
    with hub_site(gguf_hub) as url:
        srv = RemoteServer("--model", f"{GGUF_REPO}:UD-Q8_K_XL", "--n-ctx", "512",
                           env={"HF_HOME": hf_home, "HF_ENDPOINT": url})
        try:
            first = _answer(srv, GGUF_REPO)
        finally:
            srv.stop()
        _resumed(gguf_hub.gets, f"{GGUF_REPO}/SmolLM2-135M-Instruct-UD-Q8_K_XL.gguf")  # cut once, then resumed
        gguf_hub.outage = 503  # the Hub in trouble: the cached copy starts, with a warning
        srv = RemoteServer("--model", f"{GGUF_REPO}:ud-q8_k_xl", "--n-ctx", "512",
                           env={"HF_HOME": hf_home, "HF_ENDPOINT": url})
        try:
            assert _answer(srv, GGUF_REPO) == first
            assert gguf_hub.refused >= 1 and "answers 503: serving" in srv.log()
        finally:
            srv.stop()
    srv = RemoteServer("--model", f"{GGUF_REPO}:UD-Q8_K_XL", "--n-ctx", "512", "--offline",
                       env={"HF_HOME": hf_home, "HF_ENDPOINT": NOBODY})
    try:
        assert _answer(srv, GGUF_REPO) == first
    finally:
        srv.stop()


def test_a_model_folder_by_name_is_fetched_and_served_on_transformers(tmp_path):
    pytest.importorskip("torch")
    from tests.hf_models import tiny_glm4

    site = Hub({"test-org/tiny-glm4": folder_files(tiny_glm4(tmp_path / "tiny-glm4"))})
    with hub_site(site) as url:
        answers = []
        for outage in (None, 503):  # fetched, then started from the cache while the Hub answers 503
            site.outage = outage
            srv = RemoteServer("--engine", "transformers", "--model", "test-org/tiny-glm4", "--n-ctx", "512",
                               env={"HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": url})
            try:
                answers.append(_answer(srv, "test-org/tiny-glm4"))
            finally:
                srv.stop()
    assert site.refused >= 1 and answers[0] == answers[1]


def _serve(*args: str, endpoint: str, hf_home: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "glmserve", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HF_HOME": hf_home, "HF_ENDPOINT": endpoint})


@pytest.mark.parametrize(("model", "said"), [
    ("test-org/gated", "test-org/gated is gated: accept its terms on the Hub, then set HF_TOKEN"),
    (f"{GGUF_REPO}:Q2_K", f"{GGUF_REPO} has no Q2_K GGUF; it has: Q4_K_M, UD-Q8_K_XL"),
    ("test-org/elsewhere", "test-org/elsewhere is not in the Hugging Face cache"),
])
def test_what_cannot_be_fetched_stops_the_start_in_one_line(gguf_hub, tmp_path, model, said):
    engine = "llama_cpp" if ":" in model else "transformers"
    with hub_site(gguf_hub) as url:
        proc = _serve("serve", "--engine", engine, "--model", model, hf_home=str(tmp_path / "hf"),
                      endpoint=NOBODY if model == "test-org/elsewhere" else url)
    assert proc.returncode == 1, proc.stderr
    [line] = [line for line in proc.stderr.splitlines() if line.startswith("glmserve: error")]
    assert said in line, proc.stderr


def test_pull_logs_its_progress_and_resumes_a_cut_download(tmp_path):
    data = default_model_path().read_bytes()
    site = Hub({GGUF_REPO: {"SmolLM2-135M-Instruct-Q8_0.gguf": data}}, cut_after=CUT)
    with hub_site(site) as url:
        proc = _serve("pull", f"{GGUF_REPO}:Q8_0", hf_home=str(tmp_path / "hf"), endpoint=url)
    assert proc.returncode == 0, proc.stderr
    path = proc.stdout.strip()
    assert path.startswith(str(tmp_path / "hf")) and open(path, "rb").read() == data
    assert f"{GGUF_REPO}/SmolLM2-135M-Instruct-Q8_0.gguf" in site.cut
    _resumed(site.gets, f"{GGUF_REPO}/SmolLM2-135M-Instruct-Q8_0.gguf")
    assert "downloading SmolLM2-135M-Instruct-Q8_0.gguf" in proc.stderr and "(100%)" in proc.stderr, proc.stderr
