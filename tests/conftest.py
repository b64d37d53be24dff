"""Shared test fixtures: the real server in a subprocess, talked to over HTTP."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from glmserve.testing import DEFAULT_MODEL, RemoteServer

__all__ = ["DEFAULT_MODEL", "RemoteServer"]


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
