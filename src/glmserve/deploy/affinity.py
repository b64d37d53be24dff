"""Session affinity on Ray Serve: the requests of one agent session go to the same replica, whose
prefix cache holds that session's prompt (an agent resends its whole, growing conversation each
turn; on another replica the whole prompt is computed again).

A session is named by, first found:

1. the ``x-session-affinity`` header;
2. ``prompt_cache_key`` in the JSON body (OpenAI's field; Codex CLI sends its session id);
3. ``metadata.user_id`` in the JSON body (Anthropic's; Claude Code's names its session).

``SessionAffinity``, an ASGI middleware in Ray Serve's proxy (loaded with ``deploy.proxy``'s
``middlewares``), reads the name and sets it as Ray Serve's session id header
(``x-session-id``, or what ``RAY_SERVE_SESSION_ID_HEADER_KEY`` names), which the proxy passes
to the router as the request's ``session_id``; a request that already has that header keeps it.
Bodies over ``MAX_SCANNED_BODY`` bytes are passed on unread (no affinity), and so is what is
left of a body that stops arriving for ``BODY_TIMEOUT_S`` (the replica's own limits answer it).
Where the deployment has API keys (their SHA-256 digests in ``GLMSERVE_PROXY_KEY_DIGESTS``,
which ``glmserve serve --replicas`` sets for the Ray instance it starts; on an existing cluster,
set it in ``ray start``'s environment on the head node), only a request that bears one of them
(``Authorization: Bearer``, ``x-api-key``) has its body read here: any other is passed on
unread, and the replica refuses it before reading its body (``server/key_gate.py``).

``SessionAffinityRouter`` (the deployment's request router) sends a request with a session id to
the replica ranked first for it by rendezvous hashing over the running replicas (a replica
added or removed moves only its own sessions), the next ranked when that one is full; requests
without one are routed as by Ray Serve's default router (power of two choices), which it
extends.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import os
from typing import Any

from ray.serve._private.constants import SERVE_SESSION_ID
from ray.serve._private.request_router.pow_2_router import PowerOfTwoChoicesRequestRouter
from ray.serve.request_router import PendingRequest, RunningReplica
from starlette.datastructures import Headers

from glmserve.server.auth import key_digest, presented_keys

AFFINITY_HEADER = b"x-session-affinity"
MAX_SCANNED_BODY = 16 * 1024 * 1024  # bytes buffered in the proxy to find the session's name
BODY_TIMEOUT_S = 30.0  # a body that stops arriving this long is passed on unscanned
PROXY_KEYS_ENV = "GLMSERVE_PROXY_KEY_DIGESTS"  # the deployment's keys' SHA-256 digests, comma-separated


def key_digests(keys: list[str]) -> str:
    """``PROXY_KEYS_ENV``'s value for a deployment's ``keys``."""
    return ",".join(key_digest(key) for key in keys)


def _bears_a_key(headers: list[tuple[bytes, bytes]], digests: tuple[str, ...]) -> bool:
    """Whether a key the request presents (``server/auth.presented_keys``) is one of ``digests``'s
    (each compared in constant time)."""
    found = False
    for key in presented_keys(Headers(raw=headers)):
        digest = key_digest(key.strip())
        for known in digests:
            found |= hmac.compare_digest(digest, known)
    return found


def session_name(header: bytes | None, body: bytes) -> str | None:
    """The session a request belongs to (see the module docstring), or None."""
    if header:
        return header.decode("utf-8", "replace")
    try:
        data: Any = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    key = data.get("prompt_cache_key")
    if isinstance(key, str) and key:
        return key
    metadata = data.get("metadata")
    user = metadata.get("user_id") if isinstance(metadata, dict) else None
    return user if isinstance(user, str) and user else None


class SessionAffinity:
    """ASGI middleware around Ray Serve's proxy app: sets the session id header of a POST
    request from its session's name (the body is buffered, then replayed to the app)."""

    def __init__(self, app) -> None:
        self.app = app
        self.session_header = SERVE_SESSION_ID.lower().encode()
        self.digests = tuple(d for d in os.environ.get(PROXY_KEYS_ENV, "").split(",") if d)

    async def __call__(self, scope, receive, send) -> None:
        headers = scope.get("headers", []) if scope["type"] == "http" else []
        if scope["type"] != "http" or scope.get("method") != "POST" or any(
                k.lower() == self.session_header for k, _ in headers) or (
                self.digests and not _bears_a_key(headers, self.digests)):
            return await self.app(scope, receive, send)
        messages, size, complete = [], 0, False
        waiting: asyncio.Future | None = None  # a receive that outlasted BODY_TIMEOUT_S: the app's
        while not complete and size <= MAX_SCANNED_BODY:
            waiting = asyncio.ensure_future(receive())
            if not (await asyncio.wait({waiting}, timeout=BODY_TIMEOUT_S))[0]:
                break
            message, waiting = waiting.result(), None
            messages.append(message)
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            complete = not message.get("more_body", False)
        if complete:
            header = next((v for k, v in headers if k.lower() == AFFINITY_HEADER), None)
            name = session_name(header, b"".join(m.get("body", b"") for m in messages))
            if name:
                scope = {**scope, "headers": [*headers, (self.session_header, name.encode("utf-8", "replace"))]}

        async def replay():
            nonlocal waiting
            if messages:
                return messages.pop(0)
            if waiting is not None:
                pending, waiting = waiting, None
                return await pending
            return await receive()

        await self.app(scope, replay, send)


def _rank(session: str, replica: RunningReplica) -> bytes:
    return hashlib.blake2b(f"{session}\0{replica.replica_id.unique_id}".encode(), digest_size=8).digest()


class SessionAffinityRouter(PowerOfTwoChoicesRequestRouter):
    """Ray Serve request router: a session's requests to its replica (see the module docstring)."""

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        session = pending_request.metadata.session_id if pending_request is not None else ""
        if not session or not candidate_replicas:
            return await super().choose_replicas(candidate_replicas, pending_request)
        return [[replica] for replica in sorted(candidate_replicas, key=lambda r: _rank(session, r), reverse=True)]
