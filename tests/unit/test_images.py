"""Safe image loading: data URLs of several formats, and http(s) fetching with address checks,
redirect re-checks, and byte, pixel and time limits (against a local test server)."""

from __future__ import annotations

import asyncio
import base64
import io
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from PIL import Image

from glmserve.multimodal import ImageError, MediaPolicy, address_allowed, load_image


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
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802
        path = self.path
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


@pytest.fixture(scope="module")
def site():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


ALLOW_LOCAL = MediaPolicy(allowed_domains=frozenset({"127.0.0.1"}), max_bytes=100_000, max_pixels=1_000_000,
                          timeout_s=1.0)


def load(url: str, policy: MediaPolicy = ALLOW_LOCAL) -> Image.Image:
    return asyncio.run(load_image(url, policy))


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF"])
def test_data_urls_of_several_formats(fmt):
    data = encode(fmt, frames=2 if fmt == "GIF" else 1)
    image = load(f"data:image/{fmt.lower()};base64,{base64.b64encode(data).decode()}")
    assert image.size == (8, 6) and image.mode == "RGB"


@pytest.mark.parametrize(("url", "reason"), [
    ("data:image/png;base64,@@@@", "base64"),
    ("data:text/plain;base64,aGVsbG8=", "not an image"),
    ("data:image/png;base64," + base64.b64encode(b"not a png").decode(), "cannot decode"),
    ("data:image/png;base64," + base64.b64encode(HUGE).decode(), "pixels"),
    ("ftp://example.com/x.png", r"http\(s\)"),
    ("file:///etc/passwd", r"http\(s\)"),
])
def test_bad_urls(url, reason):
    with pytest.raises(ImageError, match=reason):
        load(url)


def test_http_fetch_when_the_host_is_allowed(site):
    assert load(f"{site}/ok.png").size == (8, 6)
    assert load(f"{site}/to-ok").size == (8, 6)  # redirect within the allowed host


def test_loopback_refused_by_default(site):
    with pytest.raises(ImageError, match="non-public address"):
        load(f"{site}/ok.png", MediaPolicy())
    with pytest.raises(ImageError, match="non-public address"):
        load(f"http://localhost:{site.rsplit(':', 1)[1]}/ok.png", MediaPolicy())


@pytest.mark.parametrize(("path", "reason"), [
    ("/big.png", "larger than"),
    ("/big-unannounced", "larger than"),
    ("/huge.png", "pixels"),
    ("/slow", "longer than"),
    ("/to-private", "non-public address"),
    ("/loop", "redirects"),
    ("/text", "cannot decode"),
    ("/missing", "HTTP 404"),
])
def test_fetch_limits(site, path, reason):
    with pytest.raises(ImageError, match=reason):
        load(f"{site}{path}")


@pytest.mark.parametrize(("address", "allowed"), [
    ("8.8.8.8", True), ("2606:4700:4700::1111", True), ("127.0.0.1", False), ("10.0.0.5", False),
    ("172.16.3.4", False), ("192.168.1.1", False), ("169.254.169.254", False), ("::1", False),
    ("fe80::1", False), ("::ffff:127.0.0.1", False), ("0.0.0.0", False), ("100.64.0.1", False),
])
def test_address_classification(address, allowed):
    assert address_allowed(address) is allowed
