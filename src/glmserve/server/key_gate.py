"""The API key checked before the body is read (ASGI middleware).

FastAPI runs a route's dependencies only after it has read and parsed the body (or spooled a
multipart upload), so a key check that is only a dependency lets a client without a key send
``--max-request-bytes`` a request and hold a worker while it trickles in. ``KeyGate`` finds the
route a request is for (as the router will: the first route that matches its method and path
fully), and runs that route's key check (``require_api_key``, ``require_admin_key`` or
``require_anthropic_key``, the dependency its router was given in ``server/app.py``) on the
headers alone; a refusal (401, or 403 for a non-admin key on an admin route) is answered in the
route's dialect with ``Connection: close``, the body unread, as vLLM's API-key middleware does.
The dependency runs again after the body, where it passes. A path no route matches, or a
route without a key check (``/health``, the web page), goes on to the app unchanged.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import Request
from starlette.routing import Match

from glmserve.protocol.errors import APIError
from glmserve.server.auth import KEY_CHECKS
from glmserve.server.errors import send_error


def route_key_check(scope: dict) -> Callable | None:
    """The key check of the route ``scope`` (an ASGI HTTP scope with ``app``) is for, or None
    (no route matches fully, or the route needs no key)."""
    for route in scope["app"].router.routes:
        match, _ = route.matches(scope)
        if match is Match.FULL:
            return next((d.dependency for d in getattr(route, "dependencies", ())
                         if d.dependency in KEY_CHECKS), None)
    return None


class KeyGate:
    """ASGI middleware: a request's key checked on its headers before its body is read (see the
    module's docstring); a no-op on a server without keys."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["app"].state.api_keys:
            check = route_key_check(scope)
            if check is not None:
                try:
                    await check(Request(scope))
                except APIError as exc:
                    return await send_error(send, exc, scope.get("path", ""))
        await self.app(scope, receive, send)
