"""Load the images of ``image_url`` content parts, safely.

- ``data:`` URLs of any image type Pillow decodes (PNG, JPEG, WebP, GIF: its first frame).
- ``http``/``https`` URLs, fetched with TLS verification. Unless the host is in the policy's
  ``allowed_domains``, every address the name resolves to must be public (no loopback, private,
  link-local or metadata addresses), and the address actually connected to is checked again
  (so a DNS answer that changes between the check and the connection is caught). Redirects are
  followed by hand, each target checked the same way, up to ``max_redirects``.
- Bytes, pixels and time are bounded by the policy; what does not decode is refused.

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


def decode_image(data: bytes, policy: MediaPolicy) -> Image.Image:
    """RGB image from encoded bytes; the pixel count is checked before decoding."""
    if len(data) > policy.max_bytes:
        raise ImageError(f"image is larger than {policy.max_bytes} bytes")
    try:
        image = Image.open(io.BytesIO(data))
        width, height = image.size
        if width * height > policy.max_pixels:
            raise ImageError(f"image has {width}x{height} pixels, more than {policy.max_pixels}")
        image.seek(0)  # first frame of an animation
        return image.convert("RGB")
    except ImageError:
        raise
    except (UnidentifiedImageError, Image.DecompressionBombError, OSError, ValueError, EOFError) as exc:
        raise ImageError(f"cannot decode the image: {exc}") from exc


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


async def load_image(url: str, policy: MediaPolicy) -> Image.Image:
    """The RGB image ``url`` names. Raises ``ImageError``."""
    if url.startswith("data:"):
        data = parse_data_url(url, policy)
    else:
        try:
            async with asyncio.timeout(policy.timeout_s):
                data = await _fetch(url, policy)
        except TimeoutError as exc:
            raise ImageError(f"fetching the image took longer than {policy.timeout_s:g} s") from exc
        except httpx.HTTPError as exc:
            raise ImageError(f"cannot fetch the image: {type(exc).__name__}: {exc}") from exc
    return await asyncio.to_thread(decode_image, data, policy)


async def load_images(urls: list[str], policy: MediaPolicy) -> list[Image.Image]:
    """All images, in order (fetched concurrently). The first refusal is raised with its
    ``index`` in ``urls`` set, and the other fetches are cancelled."""

    async def load(index: int, url: str) -> Image.Image:
        try:
            return await load_image(url, policy)
        except ImageError as exc:
            exc.index = index
            raise

    tasks = [asyncio.ensure_future(load(i, url)) for i, url in enumerate(urls)]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
