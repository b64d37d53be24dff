"""Stand-in GPUs for the tests: llama.cpp's ``rpc-server``, which llama.cpp treats as a GPU, with
its device memory capped (``scripts/llama_tools.py``, built by ``make llama-tools`` into
``build/llama-tools``): tensors, KV cache and compute buffers offloaded to it are really
allocated there, and an allocation past the cap is refused as a GPU out of memory refuses it.
What a device holds is what the rpc-server itself counts (it prints ``device memory held: N`` at
each change). ``llama_server`` is llama.cpp's own server from the same sources, the peer the
placement is compared with."""

from __future__ import annotations

import re
import socket
import subprocess
import tempfile
import time
from pathlib import Path

TOOLS = Path(__file__).resolve().parent.parent / "build" / "llama-tools" / "bin"
_HELD = re.compile(r"device memory held: (\d+)")


def tool(name: str) -> Path:
    """The path of one of the built tools (``ggml-rpc-server``, ``llama-server``,
    ``llama-gguf-split``); fails the test with the command that builds them when missing."""
    path = TOOLS / name
    assert path.is_file(), f"{path} is missing: run `make llama-tools`"
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RpcDevice:
    """One ``rpc-server`` on a loopback port whose device has ``mib`` MiB; ``endpoint`` is its
    HOST:PORT for ``--rpc``. Use as a context manager (stops it)."""

    def __init__(self, mib: int) -> None:
        self.mib, self.port = mib, free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self._log = tempfile.NamedTemporaryFile("w+", prefix="rpc-server-", suffix=".log", delete=False)
        self.proc = subprocess.Popen([str(tool("ggml-rpc-server")), "-H", "127.0.0.1", "-p", str(self.port), "-t", "1"],
                                     stdout=self._log, stderr=subprocess.STDOUT,
                                     env={"GGML_RPC_DEVICE_MEMORY_MIB": str(mib), "PATH": "/usr/bin:/bin"})
        deadline = time.monotonic() + 30
        while True:  # listening once a connection is taken (it then ends, sent no request)
            assert self.proc.poll() is None, f"rpc-server exited:\n{self.log()}"
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, f"rpc-server did not start:\n{self.log()}"
                time.sleep(0.05)

    def log(self) -> str:
        return Path(self._log.name).read_text(errors="replace")

    def held(self) -> int:
        """Bytes the device holds now, as the rpc-server counts them (0 before any allocation)."""
        counts = _HELD.findall(self.log())
        return int(counts[-1]) if counts else 0

    def peak(self) -> int:
        """The most bytes the device held at once."""
        return max((int(n) for n in _HELD.findall(self.log())), default=0)

    def refused(self) -> bool:
        """Whether the device refused an allocation past its cap."""
        return "device memory cap:" in self.log()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> RpcDevice:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


_OFFLOADED = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")


def offloaded(log: str) -> int:
    """The layers llama.cpp's load says it offloaded (``load_tensors: offloaded N/M layers to
    GPU``); fails the test when the log has no such line."""
    found = _OFFLOADED.findall(log)
    assert found, f"no 'offloaded N/M layers' line in:\n{log[-3000:]}"
    return int(found[-1][0])
