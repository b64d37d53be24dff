"""A PostgreSQL server of the tests' own: Debian's ``postgresql`` package (``initdb`` and
``postgres`` under ``/usr/lib/postgresql/<version>/bin``), a throw-away cluster in a temporary
folder, listening on a free loopback port with trust authentication. As root it runs as the
``postgres`` user (PostgreSQL refuses root): the child process itself switches user, so that
``proc`` is the server and signals reach it."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from glmserve.testing import free_port


def postgres_bin() -> Path:
    """The newest installed server's ``bin`` folder. Raises ``RuntimeError`` (a failed test,
    not a skip) when none is installed."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=lambda p: int(Path(p).parts[-3]))
    if not found:
        raise RuntimeError("no PostgreSQL server: install Debian's postgresql package (apt-get install postgresql)")
    return Path(found[-1]).parent


class PostgresServer:
    """Start a fresh cluster (``url``: ``postgresql://postgres@127.0.0.1:PORT/postgres``);
    ``stop()`` ends it and deletes its folder."""

    def __init__(self) -> None:
        bin_dir = postgres_bin()
        self.folder = Path(tempfile.mkdtemp(prefix="glmserve-pg-"))
        self.port = free_port()
        self._as_user: dict = {}
        if os.geteuid() == 0:
            shutil.chown(self.folder, "postgres", "postgres")
            self._as_user = {"user": "postgres", "group": "postgres", "extra_groups": []}
        data = self.folder / "data"
        self._run(str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8",
                  "--no-sync")
        self._log = open(self.folder / "server.log", "w")  # noqa: SIM115 (kept open while it runs)
        self.proc = subprocess.Popen(
            [str(bin_dir / "postgres"), "-D", str(data), "-p", str(self.port),
             "-k", str(self.folder), "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off",
             "-c", "synchronous_commit=off", "-c", "full_page_writes=off"],
            stdout=self._log, stderr=subprocess.STDOUT, **self._as_user)
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self._wait_ready(bin_dir)

    def _run(self, *cmd: str) -> None:
        subprocess.run(cmd, check=True, capture_output=True, timeout=120, **self._as_user)

    def _wait_ready(self, bin_dir: Path) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"postgres exited: {(self.folder / 'server.log').read_text()}")
            ready = subprocess.run([str(bin_dir / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)],
                                   capture_output=True)
            if ready.returncode == 0:
                return
            time.sleep(0.2)
        self.stop()
        raise RuntimeError("postgres did not become ready in 60 s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # fast shutdown: clients are disconnected
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        shutil.rmtree(self.folder, ignore_errors=True)
