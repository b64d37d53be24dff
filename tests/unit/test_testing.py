"""``glmserve.testing.RemoteServer``'s stop: waited for by default, or (``wait_on_stop=False``,
for vLLM servers whose engine core takes seconds to exit) signalled at once and waited for by
``reap`` at exit. The server here is a stand-in OpenAI server (``command``) that answers
``/health`` and, once sent SIGTERM, exits only when the test lets it (a marker file)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from glmserve import testing
from glmserve.testing import RemoteServer

SERVER = r'''
import http.server, os, signal, sys, threading, time
marker, port = sys.argv[1], int(sys.argv[3])
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def log_message(self, *args):
        pass
stopping = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stopping.set())  # before /health answers
httpd = http.server.HTTPServer(("127.0.0.1", port), Health)
threading.Thread(target=httpd.serve_forever, daemon=True).start()
stopping.wait()
print("SIGTERM", flush=True)
while not os.path.exists(marker):
    time.sleep(0.05)
'''


def _server(tmp_path: Path, wait_on_stop: bool) -> tuple[RemoteServer, Path]:
    script, marker = tmp_path / "server.py", tmp_path / "may-exit"
    script.write_text(SERVER)
    return RemoteServer(command=[sys.executable, str(script), str(marker)], wait_on_stop=wait_on_stop), marker


def test_stop_waits_for_the_exit_by_default(tmp_path):
    srv, marker = _server(tmp_path, wait_on_stop=True)
    marker.touch()  # it may exit as soon as it is signalled
    srv.stop()
    assert srv.proc.returncode == 0 and "SIGTERM" in srv.log()
    assert not os.path.exists(srv._state_dir)


def test_stop_without_waiting_signals_and_reap_waits(tmp_path):
    srv, marker = _server(tmp_path, wait_on_stop=False)
    srv.stop()  # returns although the server cannot exit yet
    assert srv.proc.poll() is None and srv in testing._stopping
    marker.touch()
    testing.reap()
    assert srv.proc.returncode == 0 and "SIGTERM" in srv.log()
    assert not os.path.exists(srv._state_dir) and srv not in testing._stopping


@pytest.fixture(autouse=True)
def _nothing_left():
    yield
    testing.reap()
