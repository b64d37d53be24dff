"""A local HTTP endpoint standing in for the server, to record the first requests a real agent
(Claude Code, Codex CLI) sends: each POST to ``path`` is recorded and refused with ``reply``
(the API's own 400 envelope), so that the agent gives up and exits. ``url`` as
``RemoteServer``'s."""

from __future__ import annotations

import http.server
import json
import threading


class Capture:
    def __init__(self, path: str, reply: dict) -> None:
        bodies = self.bodies = []
        payload = json.dumps(reply).encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                if self.path.split("?")[0] == path:
                    bodies.append(json.loads(body))
                self.send_response(400)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
