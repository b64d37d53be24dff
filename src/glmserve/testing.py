"""Run ``glmserve serve`` in a subprocess on a free loopback port (vLLM's ``RemoteOpenAIServer``
pattern), for black-box tests and benchmarks."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

DEFAULT_MODEL = "SmolLM2-135M-Instruct"
STARTUP_TIMEOUT_S = 120


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RemoteServer:
    """``glmserve serve ARGS`` on a free loopback port, healthy once constructed (raises
    ``RuntimeError`` with the server log if it exits or does not become healthy in time).
    ``log()`` is its output so far; ``stop()`` terminates it."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, n_threads: int | None = 2,
                 startup_timeout: float = STARTUP_TIMEOUT_S, command: list[str] | None = None) -> None:
        """``n_threads``: ``--n-threads`` (None: not passed, for engines without it);
        ``startup_timeout``: seconds to wait for ``/health``; ``command``: another OpenAI server's
        command line to run instead of ``glmserve serve ARGS`` (``--port PORT`` is appended)."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = tempfile.NamedTemporaryFile("w+", prefix="glmserve-", suffix=".log", delete=False)
        threads = ("--n-threads", str(n_threads)) if n_threads is not None else ()
        cmd = ([*command, "--port", str(self.port)] if command is not None
               else [sys.executable, "-m", "glmserve", "serve", "--port", str(self.port), *threads, *args])
        self.proc = subprocess.Popen(
            cmd, stdout=self._log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
        self._wait_healthy(startup_timeout)

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"server did not become healthy:\n{self.log()}")

    def wait_for_replicas(self, count: int, timeout: float = STARTUP_TIMEOUT_S) -> None:
        """Behind Ray Serve (``--replicas``): until ``/health`` reports the deployment healthy
        with ``count`` running replicas (raises ``RuntimeError`` with the last state)."""
        deadline = time.monotonic() + timeout
        state: object = None
        while time.monotonic() < deadline:
            try:
                state = httpx.get(f"{self.url}/health", timeout=10).json().get("deployment")
                if state == {"status": "HEALTHY", "replicas": {"RUNNING": count}}:
                    return
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(1)
        raise RuntimeError(f"the deployment did not reach {count} running replicas: {state}")

    def log(self) -> str:
        return Path(self._log.name).read_text(errors="replace")

    def client(self, api_key: str = "unused", **kwargs):
        """An ``openai.OpenAI`` client for this server (no retries)."""
        import openai

        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=api_key, max_retries=0, timeout=120, **kwargs)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
