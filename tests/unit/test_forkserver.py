"""tests/forkserver.py: which servers are forked, and a forked ``glmserve`` behaving as the
``python -m glmserve`` it stands for: its flags and ``GLMSERVE_*`` environment applied, its exit
status (an error's 2, a signal's minus its number) as ``subprocess`` gives it, a wait that
times out, its output in its log."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from glmserve.testing import free_port
from tests.forkserver import ForkedProcess, ForkServers, differences, engine


def test_which_fork_server_or_none():
    assert engine(["serve"], {}) == "llama_cpp"
    assert engine(["serve", "--engine", "transformers", "--model", "m"], {}) == "transformers"
    assert engine(["serve", "--engine=transformers"], {}) == "transformers"
    assert engine(["serve"], {"GLMSERVE_ENGINE": "transformers"}) == "transformers"
    for argv, env in [(["serve", "--engine", "vllm"], {}), (["serve", "--engine=vllm"], {}),
                      (["serve"], {"GLMSERVE_ENGINE": "vllm"}), (["serve", "--replicas", "2"], {}),
                      (["serve", "--config", "c.yaml"], {}), (["serve"], {"GLMSERVE_RAY_ADDRESS": "auto"})]:
        assert engine(argv, env) is None, (argv, env)


def test_variables_read_at_import_must_not_differ():
    own = {"PATH": "/bin", "HOME": "/root", "HF_HOME": "/hf"}
    for others in ({"GLMSERVE_API_KEY": "k"}, {"PYTEST_CURRENT_TEST": "t"}, {"TORCHINDUCTOR_CACHE_DIR": "/tmp/t"}):
        assert differences({**own, **others}, own) == []
    assert differences({**own, "HF_ENDPOINT": "http://127.0.0.1:9", "PYTHONPATH": "/site"}, own) == [
        "HF_ENDPOINT", "PYTHONPATH"]
    assert differences({**own, "PATH": "/usr/bin"}, own) == ["PATH"]
    assert differences({"PATH": "/bin", "HOME": "/root"}, own) == ["HF_HOME"]


@pytest.fixture(scope="module")
def forks(tmp_path_factory):
    servers = ForkServers(tmp_path_factory.mktemp("forkservers"))
    servers.launch([sys.executable, "-m", "glmserve", "--version"], open(os.devnull, "w"), dict(os.environ)).wait()
    assert servers.servers["llama_cpp"].ready()
    yield servers
    servers.stop()


def _launch(forks: ForkServers, tmp_path, *argv: str, env: dict[str, str] | None = None):
    log = open(tmp_path / "server.log", "w")
    proc = forks.launch([sys.executable, "-m", "glmserve", *argv], log, {**os.environ, **(env or {})})
    assert isinstance(proc, ForkedProcess)
    return proc, tmp_path / "server.log"


def test_a_bad_flag_exits_2_with_its_message_in_the_log(forks, tmp_path):
    proc, log = _launch(forks, tmp_path, "serve", "--no-such-flag")
    assert proc.wait(timeout=60) == 2 and proc.poll() == 2
    assert "--no-such-flag" in log.read_text()


def test_a_served_model_runs_with_its_flags_and_environment_and_ends_on_a_signal(forks, tmp_path):
    port = free_port()
    proc, log = _launch(forks, tmp_path, "serve", "--port", str(port), "--n-threads", "1",
                        env={"GLMSERVE_SERVED_MODEL_NAME": "forked"})
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=0.5)
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            try:
                models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        assert [m["id"] for m in models.json()["data"]] == ["forked"]
    finally:
        proc.kill()
    assert proc.wait(timeout=60) == -signal.SIGKILL
    proc.kill()  # after the exit: nothing to signal, no error
    assert "Uvicorn running" in log.read_text() or str(port) in log.read_text()


def test_a_variable_set_here_since_starts_a_new_fork_server(tmp_path, monkeypatch):
    """A library of the tests' process setting a variable read at import (vLLM's
    ``LD_LIBRARY_PATH``): later servers are forked from a fork server started in that
    environment; the first one goes on as the parent of what it forked."""
    servers = ForkServers(tmp_path / "forks")
    (tmp_path / "forks").mkdir()
    bad = [sys.executable, "-m", "glmserve", "serve", "--no-such-flag"]
    try:
        assert not isinstance(servers.launch(bad, open(os.devnull, "w"), dict(os.environ)), ForkedProcess)
        first = servers.servers["llama_cpp"]
        assert servers.launch(bad, open(os.devnull, "w"), dict(os.environ)).wait(timeout=60) == 2
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        assert not isinstance(servers.launch(bad, open(os.devnull, "w"), dict(os.environ)), ForkedProcess)
        second = servers.servers["llama_cpp"]
        assert second is not first and servers.retired == [first] and second.env["OMP_NUM_THREADS"] == "1"
        forked = servers.launch(bad, open(os.devnull, "w"), dict(os.environ))
        assert isinstance(forked, ForkedProcess) and forked.wait(timeout=60) == 2
        assert first.proc.poll() is None  # not stopped: it reaps what it forked
        assert servers.started == {"forked (llama_cpp)": 2, "subprocesses": 2}
    finally:
        servers.stop()
