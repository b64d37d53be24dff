"""Run ``glmserve serve`` in a subprocess on a free loopback port (vLLM's ``RemoteOpenAIServer``
pattern), for black-box tests and benchmarks."""

from __future__ import annotations

import atexit
import os
import random
import socket
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import httpx

DEFAULT_MODEL = "SmolLM2-135M-Instruct"
STARTUP_TIMEOUT_S = 120


# Ports a test server may take: above Ray's worker ports (10002-19999) and below the kernel's
# ephemeral range, from which the kernel hands out the ports of outgoing connections and of
# sockets bound to port 0 (Ray's GCS, raylet and object manager bind those): a port picked there
# could be taken by one of them between the pick and the server's own bind.
PORT_RANGE = (20000, 32768)


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A loopback TCP port free now, outside the kernel's ephemeral range where the machine
    allows it (``PORT_RANGE``), else any free one."""
    low, high = PORT_RANGE[0], min(PORT_RANGE[1], _ephemeral_start())
    for port in random.sample(range(low, high), min(200, max(high - low, 0))):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def popen(cmd: list[str], log: IO[str], env: dict[str, str]) -> subprocess.Popen:
    """``cmd`` in a subprocess with the environment ``env``, its output and errors to ``log``."""
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)


# how RemoteServer starts its process (``popen``'s signature; what it returns has ``Popen``'s ``pid``,
# ``returncode``, ``poll``, ``wait``, ``send_signal``, ``terminate`` and ``kill``): the tests put a
# preloaded fork server here (tests/forkserver.py)
launcher: Callable[[list[str], IO[str], dict[str, str]], Any] = popen


class RemoteServer:
    """``glmserve serve ARGS`` on a free loopback port, healthy once constructed (raises
    ``RuntimeError`` with the server log if it exits or does not become healthy in time).
    ``log()`` is its output so far; ``stop()`` terminates it."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, n_threads: int | None = 2,
                 startup_timeout: float = STARTUP_TIMEOUT_S, command: list[str] | None = None,
                 wait_on_stop: bool = True) -> None:
        """``n_threads``: ``--n-threads`` (None: not passed, for engines without it);
        ``startup_timeout``: seconds to wait for ``/health``; ``command``: another OpenAI server's
        command line to run instead of ``glmserve serve ARGS`` (``--port PORT`` is appended);
        ``wait_on_stop``: False for a server whose exit takes long (vLLM's engine core takes
        about 5 s to stop): ``stop()`` then returns once it is signalled, and the process is
        waited for when this Python process exits (``reap``)."""
        self.wait_on_stop = wait_on_stop
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = tempfile.NamedTemporaryFile("w+", prefix="glmserve-", suffix=".log", delete=False)
        threads = ("--n-threads", str(n_threads)) if n_threads is not None else ()
        cmd = ([*command, "--port", str(self.port)] if command is not None
               else [sys.executable, "-m", "glmserve", "serve", "--port", str(self.port), *threads, *args])
        # its own state directory (the encrypted_content key), not the user's
        self._state_dir = tempfile.mkdtemp(prefix="glmserve-state-")
        self.proc = launcher(cmd, self._log, {**os.environ, "GLMSERVE_STATE_DIR": self._state_dir, **(env or {})})
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
        """SIGTERM (a graceful shutdown), SIGKILL after 30 s; with ``wait_on_stop`` False the
        wait happens at exit (``reap``)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            if not self.wait_on_stop:
                _stopping.append(self)
                return
        self._reap()

    def _reap(self) -> None:
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self._state_dir, ignore_errors=True)


_stopping: list[RemoteServer] = []


@atexit.register
def reap() -> None:
    """Wait for the servers stopped without waiting (``wait_on_stop`` False) to exit."""
    while _stopping:
        _stopping.pop()._reap()
