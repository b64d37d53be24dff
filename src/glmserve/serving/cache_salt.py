"""Prefix-cache isolation: the cache salt of the request being served (``GenerationRequest.
cache_salt``; vLLM's ``cache_salt``): the engines reuse a cached prompt prefix only for requests
of the same salt, and ``usage.*cached_tokens`` counts only those.

The salt mixes two things: the API key's owner digest when the server has several keys (so that
key B's ``cached_tokens`` cannot tell which prefixes key A sent), and the client's own
``cache_salt`` (a request field of vLLM's, on chat completions, completions and responses). With
neither, it is None: every request shares the cache, as on a server of one user. The route sets
``CACHE_SALT`` for its request's task (``server/model_lease.py``; the batch dispatcher for each
line), and the chat and completion services pass it to the engine."""

from __future__ import annotations

import hashlib
from contextvars import ContextVar

CACHE_SALT: ContextVar[str | None] = ContextVar("glmserve_cache_salt", default=None)


def cache_salt(owner: str | None, client_salt: str | None) -> str | None:
    """The engine's salt for ``owner`` (a key's digest, or None when the keys share the cache)
    and the client's ``cache_salt``: a hex digest of both, or None when both are None."""
    if owner is None and client_salt is None:
        return None
    return hashlib.sha256(f"{owner or ''}\0{client_salt or ''}".encode()).hexdigest()[:32]
