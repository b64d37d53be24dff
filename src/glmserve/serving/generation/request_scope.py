"""What the engine request takes from who sent it, set per request task (context variables:
each holds for the task that set it and the tasks it starts, such as a background response):

- ``REQUEST_PRIORITY`` (``GenerationRequest.priority``, lower first): 0 for interactive
  requests; the batch runner sets ``BATCH_PRIORITY`` in each line's task. The llama_cpp engine
  schedules by it; vLLM does under ``--scheduling-policy priority``.
- ``CACHE_SALT`` (``GenerationRequest.cache_salt``; vLLM's ``cache_salt``): the engines reuse a
  cached prompt prefix only for requests of the same salt, and ``usage.*cached_tokens`` counts
  only those. ``cache_salt`` mixes the API key's owner digest when the server has several keys
  (so that key B's ``cached_tokens`` cannot tell which prefixes key A sent) with the client's own
  ``cache_salt`` field (chat completions, completions, responses); with neither it is None and
  every request shares the cache, as on a server of one user.

The routes set them (``server/model_lease.py``; the batch dispatcher for each line), and the chat
and completion services pass them to the engine."""

from __future__ import annotations

import hashlib
from contextvars import ContextVar

from glmserve.engine.types import BATCH_PRIORITY

REQUEST_PRIORITY: ContextVar[int] = ContextVar("glmserve_request_priority", default=0)
CACHE_SALT: ContextVar[str | None] = ContextVar("glmserve_cache_salt", default=None)


def cache_salt(owner: str | None, client_salt: str | None) -> str | None:
    """The engine's salt for ``owner`` (a key's digest, or None when the keys share the cache)
    and the client's ``cache_salt``: a hex digest of both, or None when both are None."""
    if owner is None and client_salt is None:
        return None
    return hashlib.sha256(f"{owner or ''}\0{client_salt or ''}".encode()).hexdigest()[:32]


__all__ = ["BATCH_PRIORITY", "CACHE_SALT", "REQUEST_PRIORITY", "cache_salt"]
