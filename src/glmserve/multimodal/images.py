"""Load the images of ``image_url`` content parts, safely.

- ``data:`` URLs of any image type Pillow decodes (PNG, JPEG, WebP, GIF: its first frame).
- ``http``/``https`` URLs, fetched with TLS verification. Unless the host is in the policy's
  ``allowed_domains``, every address the name resolves to must be public (no loopback, private,
  link-local or metadata addresses), and the connection is made to those checked addresses
  only (``_PublicAddresses``, the HTTP client's network backend: the name is resolved once,
  where it is checked, so a DNS answer that changes after the check, DNS rebinding, cannot send
  a request inside the network). Redirects are followed by hand, each target checked the same
  way, up to ``max_redirects``.
- Bytes, pixels and time are bounded by the policy; what does not decode is refused. A
  request's images are bounded in number (before anything is fetched) and in pixels summed
  (read from each image's header, before any is decoded).

Every refusal is an ``ImageError`` whose message names the reason (the server answers 400).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
import socket
from urllib.parse import unquote_to_bytes, urljoin, urlsplit

import httpcore
import httpx
from PIL import Image, UnidentifiedImageError

from glmserve.multimodal.policy import ImageError, MediaPolicy, address_allowed


_UNREADABLE = (UnidentifiedImageError, Image.DecompressionBombError, OSError, ValueError, EOFError)


def open_image(data: bytes, policy: MediaPolicy) -> Image.Image:
    """The image in encoded bytes, opened (its header read, nothing decoded); its size checked.
    Raises ``ImageError``."""
    if len(data) > policy.max_bytes:
        raise ImageError(f"image is larger than {policy.max_bytes} bytes")
    try:
        image = Image.open(io.BytesIO(data))
    except _UNREADABLE as exc:
        raise ImageError(f"cannot decode the image: {exc}") from exc
    width, height = image.size
    if width * height > policy.max_pixels:
        raise ImageError(f"image has {width}x{height} pixels, more than {policy.max_pixels}")
    return image


def to_rgb(image: Image.Image) -> Image.Image:
    """An opened image decoded to RGB (an animation's first frame). Raises ``ImageError``."""
    try:
        image.seek(0)
        return image.convert("RGB")
    except _UNREADABLE as exc:
        raise ImageError(f"cannot decode the image: {exc}") from exc


def decode_image(data: bytes, policy: MediaPolicy) -> Image.Image:
    """RGB image from encoded bytes; the pixel count is checked before decoding."""
    return to_rgb(open_image(data, policy))


def parse_data_url(url: str, policy: MediaPolicy) -> bytes:
    """Bytes of a ``data:[<type>][;base64],<data>`` URL (RFC 2397)."""
    header, comma, payload = url[5:].partition(",")
    if not comma:
        raise ImageError("malformed data URL: no comma")
    if header and not header.split(";")[0].startswith("image/") and header.split(";")[0]:
        raise ImageError(f"data URL is {header.split(';')[0]!r}, not an image")
    if len(payload) > policy.max_bytes * 4 // 3 + 4:
        raise ImageError(f"image is larger than {policy.max_bytes} bytes")
    if header.endswith(";base64"):
        try:
            return base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ImageError(f"malformed base64 in data URL: {exc}") from exc
    return unquote_to_bytes(payload)


class _PublicAddresses(httpcore.AsyncNetworkBackend):
    """httpcore's network backend for image fetches: a host not in ``allowed_domains`` is
    resolved here, every address it resolves to must be public (``address_allowed``), and the
    connection goes to those addresses (TLS still names the host): what is checked is what is
    connected to. Raises ``ImageError`` before any byte is sent otherwise."""

    def __init__(self, allowed_domains: frozenset[str]) -> None:
        self.allowed_domains = allowed_domains
        self.inner = httpcore.AnyIOBackend()

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                          socket_options=None) -> httpcore.AsyncNetworkStream:
        if host in self.allowed_domains:
            return await self.inner.connect_tcp(host, port, timeout, local_address, socket_options)
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise ImageError(f"cannot resolve image host {host!r}") from exc
        addresses = list(dict.fromkeys(info[4][0] for info in infos))
        if not addresses or not all(address_allowed(address) for address in addresses):
            raise ImageError(f"image host {host!r} resolves to a non-public address; allow it with "
                             "--allowed-media-domains")
        for address in addresses[:-1]:
            try:
                return await self.inner.connect_tcp(address, port, timeout, local_address, socket_options)
            except httpcore.ConnectError:
                continue
        return await self.inner.connect_tcp(addresses[-1], port, timeout, local_address, socket_options)

    async def connect_unix_socket(self, path: str, timeout: float | None = None, socket_options=None):
        raise ImageError("image URLs are fetched over TCP only")

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


def _client(policy: MediaPolicy) -> httpx.AsyncClient:
    """An HTTP client whose connections go through ``_PublicAddresses``; no redirects followed,
    no proxy from the environment."""
    transport = httpx.AsyncHTTPTransport(verify=True, trust_env=False)
    # httpx builds its httpcore pool without a way to name the network backend: the pool is
    # rebuilt with the transport's own TLS context and the checking backend
    transport._pool = httpcore.AsyncConnectionPool(ssl_context=transport._pool._ssl_context,
                                                   network_backend=_PublicAddresses(policy.allowed_domains))
    return httpx.AsyncClient(transport=transport, follow_redirects=False, trust_env=False, timeout=policy.timeout_s)


def _check_url(url: str) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ImageError(f"image URLs must be http(s) or data URLs, not {parts.scheme or 'relative'!r}")
    if not parts.hostname:
        raise ImageError("image URL has no host")


async def _fetch(url: str, policy: MediaPolicy) -> bytes:
    async with _client(policy) as client:
        for _ in range(policy.max_redirects + 1):
            _check_url(url)
            async with client.stream("GET", url, headers={"Accept": "image/*"}) as resp:
                if resp.is_redirect:
                    url = urljoin(url, resp.headers.get("location", ""))
                    continue
                if resp.status_code != 200:
                    raise ImageError(f"image URL answered HTTP {resp.status_code}")
                declared = resp.headers.get("content-length")
                if declared and declared.isdigit() and int(declared) > policy.max_bytes:
                    raise ImageError(f"image is larger than {policy.max_bytes} bytes")
                body = bytearray()
                async for chunk in resp.aiter_bytes():
                    body += chunk
                    if len(body) > policy.max_bytes:
                        raise ImageError(f"image is larger than {policy.max_bytes} bytes")
                return bytes(body)
        raise ImageError(f"more than {policy.max_redirects} redirects")


async def image_bytes(url: str, policy: MediaPolicy) -> bytes:
    """The encoded image ``url`` names (a data URL's, or fetched). Raises ``ImageError``."""
    if url.startswith("data:"):
        return parse_data_url(url, policy)
    try:
        async with asyncio.timeout(policy.timeout_s):
            return await _fetch(url, policy)
    except TimeoutError as exc:
        raise ImageError(f"fetching the image took longer than {policy.timeout_s:g} s") from exc
    except httpx.HTTPError as exc:
        raise ImageError(f"cannot fetch the image: {type(exc).__name__}: {exc}") from exc


async def load_image(url: str, policy: MediaPolicy) -> Image.Image:
    """The RGB image ``url`` names. Raises ``ImageError``."""
    return await asyncio.to_thread(decode_image, await image_bytes(url, policy), policy)


async def load_images(urls: list[str], policy: MediaPolicy) -> list[Image.Image]:
    """All images, in order: fetched concurrently and opened, their pixels summed, then
    decoded. More than ``policy.max_images``, or more than ``policy.max_request_pixels`` in all,
    is refused before anything is decoded. The first refusal is raised with its ``index`` in
    ``urls`` set (the first image over a request's bound), and the other fetches are cancelled."""
    if len(urls) > policy.max_images:
        raise _at(ImageError(f"{len(urls)} images, more than {policy.max_images} per request "
                             "(--max-images-per-request)"), policy.max_images)

    async def opened(index: int, url: str) -> Image.Image:
        try:
            data = await image_bytes(url, policy)
            return await asyncio.to_thread(open_image, data, policy)
        except ImageError as exc:
            raise _at(exc, index) from None

    tasks = [asyncio.ensure_future(opened(i, url)) for i, url in enumerate(urls)]
    try:
        images = list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
    total = 0
    for index, image in enumerate(images):
        total += image.size[0] * image.size[1]
        if total > policy.max_request_pixels:
            raise _at(ImageError(f"the request's images have more than {policy.max_request_pixels} pixels in all "
                                 "(--max-image-pixels-per-request)"), index)
    decoded = []
    for index, image in enumerate(images):
        try:
            decoded.append(await asyncio.to_thread(to_rgb, image))
        except ImageError as exc:
            raise _at(exc, index) from None
    return decoded


def _at(exc: ImageError, index: int) -> ImageError:
    exc.index = index
    return exc
