"""API-key checks for ``--api-key`` (one or several keys): ``Authorization: Bearer KEY``
(OpenAI's 401 body: ``invalid_api_key``) and, on Anthropic's routes, ``x-api-key: KEY`` as well
(Anthropic's clients send that; the 401 is then Anthropic's ``authentication_error``).

``owner``: whom a stored object belongs to, the SHA-256 digest of the key the request gave
(the key itself is never stored); ``""`` on a server without keys."""

from __future__ import annotations

import hashlib
import secrets

from fastapi import FastAPI, Request
from starlette.datastructures import Headers

from glmserve.protocol.errors import APIError


def _matches(token: str, expected: str) -> bool:
    return secrets.compare_digest(token.strip().encode(), expected.encode())


def key_digest(key: str) -> str:
    """The hex SHA-256 digest of an API key: who owns what a key stores, and how a key is named
    where the key itself must not be (the Ray proxy's ``GLMSERVE_PROXY_KEY_DIGESTS``)."""
    return hashlib.sha256(key.encode()).hexdigest()


def _bearer_of(headers: Headers) -> str | None:
    scheme, _, token = headers.get("authorization", "").partition(" ")
    return token if scheme.lower() == "bearer" else None


def presented_keys(headers: Headers) -> list[str]:
    """The keys a request presents, in ``headers``: its bearer token, then its ``x-api-key``."""
    return [t for t in (_bearer_of(headers), headers.get("x-api-key")) if t is not None]


def _bearer(request: Request) -> str | None:
    return _bearer_of(request.headers)


def _tokens(request: Request) -> list[str]:
    return presented_keys(request.headers)


def _matching_key(request: Request, tokens: list[str]) -> str | None:
    keys: tuple[str, ...] = request.app.state.api_keys
    for token in tokens:
        for key in keys:
            if _matches(token, key):
                return key
    return None


async def require_api_key(request: Request) -> None:
    """FastAPI dependency: 401 unless ``Authorization: Bearer <key>`` matches one of the
    server's keys (when it has any)."""
    if not request.app.state.api_keys:
        return
    token = _bearer(request)
    if token is None or _matching_key(request, [token]) is None:
        raise APIError(
            401,
            "Incorrect API key provided. Send it as 'Authorization: Bearer <key>'.",
            "invalid_request_error",
            None,
            "invalid_api_key",
        )


async def require_admin_key(request: Request) -> None:
    """FastAPI dependency of the admin routes: ``require_api_key``'s 401, then, on a server
    with ``--admin-api-key``, a 403 (``insufficient_permissions``) unless the bearer token is
    one of those keys."""
    await require_api_key(request)
    admin_keys: tuple[str, ...] = request.app.state.admin_keys
    token = _bearer(request)
    if admin_keys and not any(_matches(token or "", key) for key in admin_keys):
        raise APIError(403, "This route needs an admin key (--admin-api-key); the key given is not one.",
                       "invalid_request_error", None, "insufficient_permissions")


async def require_anthropic_key(request: Request) -> None:
    """FastAPI dependency for Anthropic's routes: 401 unless ``x-api-key`` or a bearer token
    matches one of the server's keys (when it has any). ``anthropic-version`` and
    ``anthropic-beta`` headers are tolerated, whatever they say."""
    if request.app.state.api_keys and _matching_key(request, _tokens(request)) is None:
        raise APIError(401, "invalid x-api-key: send the server's --api-key as 'x-api-key: <key>'",
                       "authentication_error", None, "invalid_api_key")


# the key dependencies the routers are given (server/app.py), run before the body by server/key_gate.py
KEY_CHECKS = frozenset({require_api_key, require_admin_key, require_anthropic_key})


def cache_owner(app: FastAPI, owner_digest: str) -> str | None:
    """Whose prefix caches a request of ``owner_digest`` may share (``serving/generation/request_scope.py``):
    that owner's on a server of several keys, everyone's (None) on a server of one key or none."""
    return owner_digest if len(app.state.api_keys) > 1 else None


def owner(request: Request) -> str:
    """Who owns what this request stores: the hex SHA-256 digest of its matching API key, or
    ``""`` when the server has no keys. Call after ``require_api_key``."""
    key = _matching_key(request, _tokens(request)) if request.app.state.api_keys else None
    return "" if key is None else key_digest(key)


def check_keep_alive(app: FastAPI, owner_digest: str, keep_alive: float | None) -> None:
    """A request's ``keep_alive`` decides when a model shared by every key is unloaded (``0``:
    at once, a negative value: never), as ``/models/unload`` does: on a server with
    ``--admin-api-key`` only an admin key may give one (a 403, ``insufficient_permissions``);
    ``owner_digest``: the request's ``owner``."""
    admin_keys: tuple[str, ...] = app.state.admin_keys
    if keep_alive is None or not admin_keys:
        return
    if owner_digest not in {key_digest(key) for key in admin_keys}:
        raise APIError(403, "keep_alive decides when a model every key shares is unloaded: it needs an admin key "
                            "(--admin-api-key) on this server", "invalid_request_error", "keep_alive",
                       "insufficient_permissions")
