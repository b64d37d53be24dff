"""A preloaded fork server for the tests' ``glmserve serve`` processes (the zygote pattern of
Android's app starts and of Python's own ``multiprocessing`` "forkserver" start method).

A start of ``python -m glmserve serve`` spends about a second of this machine's CPU importing
the same modules (FastAPI, SQLAlchemy and Alembic, llama-cpp-python, NumPy, glmserve itself),
and the suite starts servers about 170 times. This process imports them once, then forks each
server from itself: the child takes its request's environment, working directory, log file and
``sys.argv``, and runs ``glmserve``'s ``__main__`` exactly as ``python -m glmserve`` does
(``runpy``); its exit unwinds to the interpreter's own (threads joined, ``atexit`` run).

What a fork cannot change is kept: modules imported here read some variables when imported, so
a request is forked only where those (``READ_AT_IMPORT``) are as in this process's environment
(``differences``); one with another ``HF_ENDPOINT``, ``PYTHONPATH`` or ``PATH`` gets a plain
subprocess, as do vLLM's and Ray's servers (``engine``).

Protocol, one Unix-socket connection per server: the client sends one JSON line (``argv``,
``env``, ``cwd``, ``log``: the path its output goes to); the server answers ``{"pid": N}``, then
``{"returncode": R}`` when the child has exited (``R`` as ``subprocess``: minus the signal
number when a signal ended it)."""

from __future__ import annotations

import collections
import itertools
import json
import os
import runpy
import selectors
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from glmserve.testing import popen

# what ``glmserve serve`` imports, by engine (``python -X importtime -m glmserve serve``): one fork
# server each, so that a server holds no library its engine would not have imported (the tests
# measure servers' memory)
SERVING = ("glmserve.cli", "glmserve.composition", "glmserve.state", "glmserve.runtime.start", "glmserve.server.app",
           "glmserve.server.http_protocol", "uvicorn.main", "uvicorn.protocols.http.httptools_impl",
           "uvicorn.protocols.websockets.websockets_sansio_impl", "uvloop", "sqlalchemy.dialects.sqlite.aiosqlite",
           "sqlalchemy.dialects.sqlite.pysqlite")
PRELOAD = {"llama_cpp": (*SERVING, "glmserve.engine.llama_cpp.engine"),
           "transformers": (*SERVING, "glmserve.engine.transformers.engine", "transformers.models.llama.modeling_llama")}
# flags whose servers start other processes (vLLM's engine core by ``spawn``, Ray): a plain subprocess
NOT_FORKED_FLAGS = ("--engine=vllm", "--replicas", "--ray-address", "--config")
NOT_FORKED_ENV = {"GLMSERVE_ENGINE": "vllm", "GLMSERVE_REPLICAS": None, "GLMSERVE_RAY_ADDRESS": None,
                  "GLMSERVE_CONFIG": None}


def engine(argv: list[str], env: dict[str, str]) -> str | None:
    """The fork server (a ``PRELOAD`` key) for ``glmserve ARGV`` with the environment ``env``, or
    None for a plain subprocess."""
    joined = [f"{a}={b}" for a, b in zip(argv, argv[1:])] + argv
    if any(flag in joined for flag in NOT_FORKED_FLAGS):
        return None
    if any(name in env and value in (None, env[name]) for name, value in NOT_FORKED_ENV.items()):
        return None
    if "--engine=transformers" in joined or env.get("GLMSERVE_ENGINE") == "transformers":
        return "transformers"
    return "llama_cpp"


# variables read when a preloaded module is imported (the Hub's endpoint and cache, thread pools,
# library paths, the interpreter's own): a request whose value differs from the fork server's is
# not forked. Others (``GLMSERVE_*``, which settings read at start-up; what a library set in the
# tests' process, as torch's ``TORCHINDUCTOR_CACHE_DIR``) reach the child in its environment.
READ_AT_IMPORT = ("HF_", "HUGGINGFACE_", "TRANSFORMERS_", "TOKENIZERS_", "TORCH_", "PYTORCH_", "OMP_", "MKL_",
                  "OPENBLAS_", "LLAMA_", "GGML_", "CUDA_", "LD_", "PYTHON", "HOME", "XDG_", "PATH")


def differences(env: dict[str, str], own_env: dict[str, str]) -> list[str]:
    """The variables of ``READ_AT_IMPORT`` whose values differ between ``env`` (a server's) and
    ``own_env`` (the fork server's): none where the server runs in a fork as it would alone."""
    return sorted(k for k in set(env) | set(own_env)
                  if k.startswith(READ_AT_IMPORT) and env.get(k) != own_env.get(k))


def _child(request: dict, inherited: list) -> None:
    """In the forked child: close what it inherited of the fork server (sockets, the selector:
    objects with ``close()``; pipe ends: numbers), then become ``python -m glmserve ARGV``;
    returns only by raising ``SystemExit`` (which ends the process as the interpreter's own exit
    does)."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for thing in inherited:
        if isinstance(thing, int):
            os.close(thing)
        else:
            thing.close()
    log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.path[0] = request["cwd"]
    sys.argv = ["glmserve", *request["argv"]]
    runpy.run_module("glmserve", run_name="__main__", alter_sys=True)
    raise SystemExit(0)


def serve(path: str, name: str) -> None:
    """Import ``PRELOAD[name]``, then fork a child for each request on the Unix socket ``path``
    (single-threaded: children are reaped on ``SIGCHLD`` in the same select loop)."""
    for module in PRELOAD[name]:
        __import__(module)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path + ".new")
    listener.listen(64)
    os.rename(path + ".new", path)  # the path appears once connections are accepted
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    children: dict[int, socket.socket] = {}
    while True:
        for key, _ in selector.select():
            if key.fileobj is listener:
                conn, _ = listener.accept()
                with conn.makefile("rb") as lines:
                    request = json.loads(lines.readline())
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    _child(request, [selector, listener, wake_r, wake_w, conn, *children.values()])
                children[pid] = conn
                conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
            else:
                while True:
                    try:
                        os.read(wake_r, 512)
                    except BlockingIOError:
                        break
                while children:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                    if pid == 0:
                        break
                    conn = children.pop(pid, None)
                    if conn is not None:
                        try:
                            conn.sendall(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
                        except OSError:
                            pass
                        conn.close()


class ForkedProcess:
    """A server forked by the fork server, with the parts of ``subprocess.Popen`` the tests use:
    ``pid``, ``returncode``, ``poll()``, ``wait(timeout)`` (raises ``subprocess.TimeoutExpired``),
    ``send_signal``, ``terminate``, ``kill``."""

    def __init__(self, path: str, argv: list[str], env: dict[str, str], log: str) -> None:
        self.args = argv
        self.returncode: int | None = None
        self._conn = socket.socket(socket.AF_UNIX)
        self._conn.connect(path)
        self._conn.sendall(json.dumps({"argv": argv, "env": env, "cwd": os.getcwd(), "log": log}).encode() + b"\n")
        self._buffer = b""
        self.pid: int = self._message(None)["pid"]

    def _message(self, timeout: float | None) -> dict | None:
        """The fork server's next message ({} once it is gone), or None if none came in ``timeout``."""
        self._conn.settimeout(timeout)
        while b"\n" not in self._buffer:
            try:
                data = self._conn.recv(4096)
            except (TimeoutError, BlockingIOError):
                return None
            if not data:
                return {}
            self._buffer += data
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def _read(self, timeout: float | None) -> None:
        message = self._message(timeout)
        if message == {}:  # the fork server is gone (killed): its children went to init, and their exit
            # status with them; once the pid has ended it reads as SIGKILL's
            deadline = None if timeout is None else time.monotonic() + timeout
            while Path(f"/proc/{self.pid}").exists() and (deadline is None or time.monotonic() < deadline):
                time.sleep(0.1)
            if not Path(f"/proc/{self.pid}").exists():
                self.returncode = -signal.SIGKILL
        elif message is not None:
            self.returncode = message["returncode"]
        if self.returncode is not None:
            self._conn.close()

    def poll(self) -> int | None:
        if self.returncode is None:
            self._read(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self._read(timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


_numbers = itertools.count()  # fork servers' socket and log files, one each


class ForkServer:
    """A fork server for ``engine`` (a ``PRELOAD`` key) in a subprocess of this one with the
    environment ``env``, its socket and log in ``directory``."""

    def __init__(self, directory: Path, engine: str, env: dict[str, str]) -> None:
        name = directory / f"{engine}-{next(_numbers)}"
        self.path = f"{name}.sock"
        self.env = env
        self._log = open(f"{name}.log", "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.forkserver", self.path, engine], env=env,
                                     stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                                     cwd=Path(__file__).parent.parent)

    def ready(self, timeout: float = 120) -> bool:
        """Whether it accepts requests (waits for its imports)."""
        deadline = time.monotonic() + timeout
        while not os.path.exists(self.path) and self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.proc.poll() is None and os.path.exists(self.path)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self._log.close()


class ForkServers:
    """A ``ForkServer`` per engine in ``PRELOAD`` under ``directory``, each started by the first
    server of its engine (which runs as a plain subprocess meanwhile: a run of unit tests starts
    none); ``launch`` is ``glmserve.testing.launcher``. A fork server runs in this process's
    environment as it was when it started; where a library has changed a variable of
    ``READ_AT_IMPORT`` here since (vLLM sets ``LD_LIBRARY_PATH`` when imported), a new one is
    started in the environment as it is now. ``started`` counts the servers by how they started."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.servers: dict[str, ForkServer] = {}
        self.retired: list[ForkServer] = []  # still the parents of the servers they forked
        self.started: collections.Counter = collections.Counter()

    def launch(self, cmd: list[str], log, env: dict[str, str]):
        """``cmd`` (``python -m glmserve ARGS``) forked with its output to ``log`` (an open file),
        or ``glmserve.testing.popen``'s subprocess where it cannot be."""
        if cmd[:3] == [sys.executable, "-m", "glmserve"] and (name := engine(cmd[3:], env)) is not None:
            server = self.servers.get(name)
            if server is None or differences(dict(os.environ), server.env):
                if server is not None:
                    self.retired.append(server)
                self.servers[name] = ForkServer(self.directory, name, dict(os.environ))
            elif differ := differences(env, server.env):
                self.started[f"subprocesses ({', '.join(differ)} differing)"] += 1
                return popen(cmd, log, env)
            elif server.ready():
                self.started[f"forked ({name})"] += 1
                return ForkedProcess(server.path, cmd[3:], env, log.name)
        self.started["subprocesses"] += 1
        return popen(cmd, log, env)

    def stop(self) -> None:
        for server in [*self.servers.values(), *self.retired]:
            server.stop()


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2])
