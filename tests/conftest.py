"""Shared test fixtures: the real server in a subprocess, talked to over HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from glmserve.testing import DEFAULT_MODEL, RemoteServer

__all__ = ["DEFAULT_MODEL", "RemoteServer", "vllm_server"]

# vLLM on this CPU: a small KV cache (GiB), and float32 without torch.compile (bfloat16 drifts
# into nonsense on SmolLM2; torch.compile takes minutes to start)
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}


def vllm_server(model: Path, *args: str) -> RemoteServer:
    """``glmserve serve --engine vllm`` on ``model`` (a Hugging Face folder), skipped without vLLM."""
    pytest.importorskip("vllm")
    return RemoteServer("--engine", "vllm", "--model", str(model), "--dtype", "float32", "--enforce-eager", *args,
                        env=VLLM_ENV, n_threads=None, startup_timeout=600)


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
    differently; see the README's "known limits" under continuous batching)."""
    srv = RemoteServer()
    yield srv.client()
    srv.stop()
