"""Load the images of ``image_url`` content parts, safely.

- ``data:`` URLs of any image type Pillow decodes (PNG, JPEG, WebP, GIF: its first frame).
- ``http``/``https`` URLs, fetched with TLS verification. Unless the host is in the policy's
  ``allowed_domains``, every address the name resolves to must be public (no loopback, private,
  link-local or metadata addresses), and the address actually connected to is checked again
  (so a DNS answer that changes between the check and the connection is caught). Redirects are
  followed by hand, each target checked the same way, up to ``max_redirects``.
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


def _check_host(host: str, port: int, policy: MediaPolicy) -> None:
    if host in policy.allowed_domains:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ImageError(f"cannot resolve image host {host!r}") from exc
    for info in infos:
        if not address_allowed(info[4][0]):
            raise ImageError(f"image host {host!r} resolves to a non-public address; allow it with "
                             "--allowed-media-domains")


def _check_url(url: str, policy: MediaPolicy) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ImageError(f"image URLs must be http(s) or data URLs, not {parts.scheme or 'relative'!r}")
    if not parts.hostname:
        raise ImageError("image URL has no host")
    _check_host(parts.hostname, parts.port or (443 if parts.scheme == "https" else 80), policy)
    return parts.hostname


async def _fetch(url: str, policy: MediaPolicy) -> bytes:
    async with httpx.AsyncClient(follow_redirects=False, verify=True, trust_env=False,
                                 timeout=policy.timeout_s) as client:
        for _ in range(policy.max_redirects + 1):
            host = await asyncio.to_thread(_check_url, url, policy)
            async with client.stream("GET", url, headers={"Accept": "image/*"}) as resp:
                peer = resp.extensions.get("network_stream")
                server = peer.get_extra_info("server_addr") if peer is not None else None
                if server and host not in policy.allowed_domains and not address_allowed(server[0]):
                    raise ImageError(f"image host {host!r} connected to a non-public address")
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
