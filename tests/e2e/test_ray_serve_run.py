"""An operator's deployment: Ray Serve's own ``serve run`` on a config file whose application
is glmserve's builder (``glmserve.deploy.ray:build``), on a local Ray instance of its own."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import openai
import pytest

from glmserve.testing import free_port
from tests.conftest import DEFAULT_MODEL

pytest.importorskip("ray")
from glmserve.deploy.ray import PROXY_CALLBACK, PROXY_CALLBACK_ENV  # noqa: E402

SYSTEM = {"role": "system", "content": "You are a helpful AI assistant."}
QUESTION = {"role": "user", "content": "What is the capital of France?"}
SETTLE_S = 240
# serve run's own shutdown on Ctrl-C: about 5 s alone, but it may hang: the test once sent SIGINT to
# its whole process group (Ray's daemons too) and waited up to 120 s (131 s in a suite run, 16 s
# alone); with SIGINT to serve run alone and 30 s here, a suite run still took 41 s. Its shutdown
# is not what this test checks: after this, SIGKILL to the group
SHUTDOWN_S = 10


def test_serve_run_builder_from_a_config_file(tmp_path: Path):
    port = free_port()
    config = tmp_path / "serve.yaml"
    config.write_text(json.dumps({  # JSON is YAML
        "proxy_location": "HeadOnly",
        "http_options": {"host": "127.0.0.1", "port": port},
        "applications": [{"name": "glmserve", "route_prefix": "/", "import_path": "glmserve.deploy.ray:build",
                          "args": {"replicas": 1, "n_threads": 1, "max_num_seqs": 2}}],
    }))
    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
    env = {**{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}, PROXY_CALLBACK_ENV: PROXY_CALLBACK}
    proc = subprocess.Popen([str(Path(sys.executable).parent / "serve"), "run", str(config)], stdout=log,
                            stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + SETTLE_S
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if httpx.get(f"{url}/health", timeout=10).json()["deployment"]["status"] == "HEALTHY":
                    break
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            time.sleep(1)
        else:
            raise AssertionError(f"serve run did not deploy:\n{Path(log.name).read_text()[-4000:]}")
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=120)
        raw = client.chat.completions.with_raw_response.create(
            model=DEFAULT_MODEL, messages=[SYSTEM, QUESTION], temperature=0, max_tokens=32)
        assert raw.headers["x-glmserve-replica"]
        assert "Paris" in raw.parse().choices[0].message.content
        assert [m.id for m in client.models.list()] == [DEFAULT_MODEL]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # serve run shuts Serve and its Ray instance down
            try:
                proc.wait(timeout=SHUTDOWN_S)
            except subprocess.TimeoutExpired:
                pass
        with contextlib.suppress(ProcessLookupError):  # whatever of its Ray instance is left
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
