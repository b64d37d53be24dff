"""Which hosts an ``image_url`` may point at, and the limits on what is fetched."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field


class ImageError(ValueError):
    """An image the server will not take; the message is for the client (a 400). ``index``:
    which of several images (``load_images``), else None."""

    index: int | None = None


@dataclass(frozen=True, slots=True)
class MediaPolicy:
    """``allowed_domains``: hosts exempt from the address checks (for example an intranet
    image server); ``max_bytes`` per image; ``max_pixels`` = width x height of one image;
    ``max_images`` and ``max_request_pixels`` (their width x height summed) per request, as
    vLLM's ``--limit-mm-per-prompt``; ``timeout_s`` for the whole fetch, redirects included;
    ``max_redirects`` followed, each one re-checked."""

    allowed_domains: frozenset[str] = field(default_factory=frozenset)
    max_bytes: int = 20 * 1024 * 1024
    max_pixels: int = 40_000_000
    max_images: int = 16
    max_request_pixels: int = 50_000_000
    timeout_s: float = 10.0
    max_redirects: int = 3


def address_allowed(address: str) -> bool:
    """False for loopback, private, link-local (cloud metadata 169.254.169.254 included),
    multicast, reserved and unspecified addresses, also inside IPv4-mapped IPv6."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return not (ip.is_loopback or ip.is_private or ip.is_link_local or ip.is_multicast or ip.is_reserved
                or ip.is_unspecified or not ip.is_global)
