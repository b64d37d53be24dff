"""What the engine request takes from who sent it, set per request task (a context variable:
it holds for the task that set it and the tasks it starts, such as a background response):

- ``CACHE_SALT`` (``GenerationRequest.cache_salt``; vLLM's ``cache_salt``): the engines reuse a
  cached prompt prefix only for requests of the same salt, and ``usage.*cached_tokens`` counts
  only those. ``cache_salt`` mixes the API key's owner digest when the server has several keys
  (so that key B's ``cached_tokens`` cannot tell which prefixes key A sent) with the client's own
  ``cache_salt`` field (chat completions, completions, responses); with neither it is None and
  every request shares the cache, as on a server of one user.

- ``TENANT`` (``GenerationRequest.tenant``): the API key's owner digest on a server of several
  keys (None on a server of one key or none), among whom admission and the engines' queues
  share places and turns (``engine/admission.py``). Not the salt: a client chooses its own
  ``cache_salt``, not its key.

- ``OWNER``: the owner digest of the request's API key (``""`` on a server without keys), to
  which sealed reasoning is bound (``serving/responses/sealed_reasoning.py``).

The routes set them (``server/model_lease.py``; the batch dispatcher for each line), and the chat
and completion services pass the salt and the tenant to the engine (``engine_scope``). (A request's priority is an argument of the
services' ``create``: ``INTERACTIVE_PRIORITY``, or ``BATCH_PRIORITY`` for batch lines.)"""

from __future__ import annotations

import hashlib
from contextvars import ContextVar

CACHE_SALT: ContextVar[str | None] = ContextVar("glmserve_cache_salt", default=None)
OWNER: ContextVar[str] = ContextVar("glmserve_owner", default="")
TENANT: ContextVar[str | None] = ContextVar("glmserve_tenant", default=None)


def engine_scope() -> dict[str, str | None]:
    """This task's ``GenerationRequest`` fields from who sent it: ``cache_salt`` and ``tenant``."""
    return {"cache_salt": CACHE_SALT.get(), "tenant": TENANT.get()}


def cache_salt(owner: str | None, client_salt: str | None) -> str | None:
    """The engine's salt for ``owner`` (a key's digest, or None when the keys share the cache)
    and the client's ``cache_salt``: a hex digest of both, or None when both are None."""
    if owner is None and client_salt is None:
        return None
    return hashlib.sha256(f"{owner or ''}\0{client_salt or ''}".encode()).hexdigest()[:32]


__all__ = ["CACHE_SALT", "OWNER", "TENANT", "cache_salt", "engine_scope"]
