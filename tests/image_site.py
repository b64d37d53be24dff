"""A local image site for image-fetching tests: good images and every kind of bad answer
(oversize, too many pixels, slow, redirects to private addresses and in loops, not an image)."""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from PIL import Image


def encode(fmt: str, size=(8, 6), frames: int = 1) -> bytes:
    buf = io.BytesIO()
    images = [Image.new("RGB", size, (i * 60, 100, 200)) for i in range(frames)]
    images[0].save(buf, format=fmt, save_all=frames > 1, append_images=images[1:])
    return buf.getvalue()


PNG = encode("PNG")
HUGE = encode("PNG", size=(3000, 3000))  # 9 Mpx, a few KB compressed


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass

    def _send(self, status: int, body: bytes = b"", headers: dict | None = None) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if "Content-Length" not in (headers or {}):
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up first (the slow case)
            pass

    def do_GET(self) -> None:  # noqa: N802
        path = self.path
        REQUESTS.append(path)
        if path == "/ok.png":
            self._send(200, PNG, {"Content-Type": "image/png"})
        elif path == "/big.png":
            self._send(200, PNG + b"\0" * 300_000)
        elif path == "/big-unannounced":
            self.send_response(200)
            self.end_headers()  # no Content-Length: read until close
            self.wfile.write(b"\0" * 300_000)
            self.close_connection = True
        elif path == "/huge.png":
            self._send(200, HUGE)
        elif path == "/slow":
            time.sleep(3)
            self._send(200, PNG)
        elif path == "/to-private":
            self._send(302, headers={"Location": "http://10.11.12.13/secret.png"})
        elif path == "/to-ok":
            self._send(302, headers={"Location": "/ok.png"})
        elif path == "/loop":
            self._send(302, headers={"Location": "/loop"})
        elif path == "/text":
            self._send(200, b"hello, not an image", {"Content-Type": "text/plain"})
        else:
            self._send(404, b"nope")


REQUESTS: list[str] = []  # every path asked for, by any site


@contextmanager
def image_site() -> Iterator[str]:
    """Serve ``Handler`` on a free loopback port; yields its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
