"""Safe image loading: data URLs of several formats, and http(s) fetching with address checks,
redirect re-checks, and byte, pixel and time limits (against a local test server)."""

from __future__ import annotations

import asyncio
import base64
import socket

import pytest
from PIL import Image

from glmserve.multimodal import ImageError, MediaPolicy, address_allowed, load_image, load_images
from tests.image_site import HUGE, REQUESTS, encode, image_site


@pytest.fixture(scope="module")
def site():
    with image_site() as url:
        yield url


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


def _data_url(size: tuple[int, int]) -> str:
    return "data:image/png;base64," + base64.b64encode(encode("PNG", size=size)).decode()


def test_a_requests_images_are_bounded_in_number_before_any_is_fetched(site):
    policy = MediaPolicy(allowed_domains=frozenset({"127.0.0.1"}), max_images=2, timeout_s=30.0)
    before = len(REQUESTS)
    with pytest.raises(ImageError, match=r"^3 images, more than 2 per request \(--max-images-per-request\)$") as err:
        asyncio.run(load_images([f"{site}/ok.png", f"{site}/ok.png", f"{site}/slow"], policy))
    assert err.value.index == 2
    assert REQUESTS[before:] == []  # the image site got no request: none was fetched
    assert [i.size for i in asyncio.run(load_images([f"{site}/ok.png"], policy))] == [(8, 6)]
    assert len(REQUESTS) == before + 1  # (the log sees a fetch)
    assert [i.size for i in asyncio.run(load_images([_data_url((8, 6)), _data_url((4, 4))], policy))] == [(8, 6), (4, 4)]


def test_a_requests_images_are_bounded_in_pixels_in_all_before_any_is_decoded(monkeypatch):
    from glmserve.multimodal import images

    decoded = []
    monkeypatch.setattr(images, "to_rgb", lambda image: decoded.append(image.size) or image.convert("RGB"))
    policy = MediaPolicy(max_pixels=1_000_000, max_request_pixels=1_500_000)
    urls = [_data_url((500, 1000)), _data_url((1000, 500)), _data_url((1000, 600))]  # 0.5 + 0.5 + 0.6 Mpx
    with pytest.raises(ImageError, match=r"more than 1500000 pixels in all \(--max-image-pixels-per-request\)") as err:
        asyncio.run(load_images(urls, policy))
    assert err.value.index == 2 and decoded == []  # nothing decoded
    assert [i.size for i in asyncio.run(load_images(urls[:2], policy))] == [(500, 1000), (1000, 500)]
    assert decoded == [(500, 1000), (1000, 500)]


def test_a_name_that_rebinds_to_a_private_address_is_never_connected_to(site, monkeypatch):
    """DNS rebinding (issue 91, 7): a name that resolves to a public address when checked and to
    the server's own network when connected. The address checked is the address connected to,
    so the image site on 127.0.0.1 never gets the request (it used to get it, and the check of
    the address connected to came after the request was sent)."""
    port = int(site.rsplit(":", 1)[1])
    answers = iter([("93.184.215.14",)] + [("127.0.0.1",)] * 10)  # public once (example.com), then loopback
    real = socket.getaddrinfo

    def rebinding(host, *args, **kwargs):
        if host not in ("rebind.test", b"rebind.test"):  # anyio asks with the name encoded
            return real(host, *args, **kwargs)
        (address,) = next(answers)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    before = len(REQUESTS)
    with pytest.raises(ImageError):
        load(f"http://rebind.test:{port}/ok.png", MediaPolicy(timeout_s=2.0))
    assert REQUESTS[before:] == []  # no request reached the private address
