"""Shared test fixtures: the real server in a subprocess, talked to over HTTP."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from glmserve import testing
from glmserve.testing import DEFAULT_MODEL, RemoteServer
from tests.forkserver import ForkServers

__all__ = ["DEFAULT_MODEL", "RemoteServer", "greedy_streams", "vllm_server"]


def pytest_report_header(config) -> str:
    """The llama.cpp build the tests run on: its devices (a CPU build has the CPU alone)."""
    try:
        from glmserve.engine.llama_cpp.loading.devices import devices
    except ImportError:
        return "llama.cpp: not installed"
    return "llama.cpp devices: " + ", ".join(f"{d.name} ({d.backend}, {d.kind})" for d in devices())

# vLLM on this CPU: a small KV cache (GiB), and float32 without torch.compile (bfloat16 drifts
# into nonsense on SmolLM2; torch.compile takes minutes to start)
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}


def pytest_sessionstart(session) -> None:
    """Test servers are forked from processes that imported their modules once
    (tests/forkserver.py), unless ``GLMSERVE_TEST_FORKSERVER=0``."""
    if os.environ.get("GLMSERVE_TEST_FORKSERVER") != "0":
        session.config.forkservers = ForkServers(Path(tempfile.mkdtemp(prefix="glmserve-forkservers-")))
        testing.launcher = session.config.forkservers.launch


def pytest_sessionfinish(session) -> None:
    if getattr(session.config, "forkservers", None) is not None:
        testing.launcher = testing.popen
        session.config.forkservers.stop()
        shutil.rmtree(session.config.forkservers.directory, ignore_errors=True)


SLOWEST_FILES = 25  # test files listed in the summary, slowest first
FILE_SECONDS: dict[str, float] = {}  # each test file's setup, call and teardown time, for the summary


def pytest_runtest_logreport(report) -> None:
    FILE_SECONDS[report.nodeid.split("::")[0]] = FILE_SECONDS.get(report.nodeid.split("::")[0], 0.0) + report.duration


def pytest_terminal_summary(terminalreporter) -> None:
    """The ``SLOWEST_FILES`` slowest test files (their tests' setup, call and teardown, module
    fixtures included), after ``--durations``' slowest tests: where the suite's time goes."""
    forkservers = getattr(terminalreporter.config, "forkservers", None)
    if forkservers is not None and forkservers.started:
        terminalreporter.write_line("test servers: " + ", ".join(f"{n} {how}" for how, n in
                                                                   sorted(forkservers.started.items())))
    slowest = sorted(FILE_SECONDS.items(), key=lambda item: -item[1])[:SLOWEST_FILES]
    if slowest:
        terminalreporter.write_sep("=", f"slowest {len(slowest)} test files")
        for path, seconds in slowest:
            terminalreporter.write_line(f"{seconds:8.1f}s {path}")


def vllm_server(model: Path, *args: str, env: dict[str, str] | None = None) -> RemoteServer:
    """``glmserve serve --engine vllm`` on ``model`` (a Hugging Face folder), skipped without vLLM;
    ``env``: more environment variables for the server. Its ``stop()`` does not wait for the
    exit (vLLM's engine core takes about 5 s to stop; the next test need not wait for it)."""
    pytest.importorskip("vllm")
    return RemoteServer("--engine", "vllm", "--model", str(model), "--dtype", "float32", "--enforce-eager", *args,
                        env={**VLLM_ENV, **(env or {})}, n_threads=None, startup_timeout=600, wait_on_stop=False)


def greedy_streams(url: str, model: str, messages: list[list[dict]], max_tokens: int = 32,
                   ignore_eos: bool = False) -> tuple[list[str], list[str]]:
    """The texts (reasoning and content) of greedy streams of ``messages`` run one after another,
    then all at once: (sequential, concurrent). Batching must not change a greedy result.
    ``ignore_eos``: every stream runs to ``max_tokens`` (a random model may end its turn at once)."""
    import asyncio

    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=300)

    async def stream(m: list[dict]) -> str:
        chunks = await client.chat.completions.create(model=model, messages=m, temperature=0, max_tokens=max_tokens,
                                                      stream=True, extra_body={"ignore_eos": ignore_eos})
        return "".join([((c.choices[0].delta.model_extra or {}).get("reasoning_content") or "")
                        + (c.choices[0].delta.content or "") async for c in chunks if c.choices])

    async def run():
        sequential = [await stream(m) for m in messages]
        return sequential, list(await asyncio.gather(*(stream(m) for m in messages)))

    return asyncio.run(run())


@pytest.fixture(scope="session")
def server() -> Iterator[RemoteServer]:
    """The default model, default settings."""
    srv = RemoteServer()
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def client(server: RemoteServer) -> openai.OpenAI:
    return server.client()


@pytest.fixture
def fresh_client() -> Iterator[openai.OpenAI]:
    """A client of a server of its own, whose KV cache starts empty: for tests that compare two
    greedy runs token for token (after much cache reuse llama.cpp may round attention
    differently; see the known limits under continuous batching in docs/performance/batching.md)."""
    srv = RemoteServer()
    yield srv.client()
    srv.stop()
