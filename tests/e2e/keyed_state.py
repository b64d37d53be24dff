"""What the state tests through the SDKs share (``test_stored_responses.py``, ``test_batches.py``):
a server of two keys on the module's state database (``state_backend``), greedy, the first key's
client and the model's id, and the server's metrics read with that key. A test module imports
the fixtures it uses by name; each module gets its own server."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator

import httpx
import openai
import pytest

from glmserve.testing import RemoteServer

KEY, OTHER_KEY = "key-a", "key-b"
GREEDY = ("--override-generation-config", '{"temperature": 0}')


@pytest.fixture(scope="module")
def server(state_backend) -> Iterator[RemoteServer]:
    srv = RemoteServer("--api-key", KEY, "--api-key", OTHER_KEY, *GREEDY, env=state_backend[1])
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return server.client(api_key=KEY)


@pytest.fixture(scope="module")
def model(client) -> str:
    return client.models.list().data[0].id


def metric(server: RemoteServer, name: str) -> float:
    """The sum of metric ``name``'s series on ``server`` (read with ``KEY``)."""
    text = httpx.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", text, re.M))


def wait_until(done: Callable[[], bool], timeout_s: float = 60.0) -> None:
    """Poll ``done`` every 50 ms until it holds or ``timeout_s`` pass (the caller asserts)."""
    deadline = time.monotonic() + timeout_s
    while not done() and time.monotonic() < deadline:
        time.sleep(0.05)
