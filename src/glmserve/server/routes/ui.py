"""The web chat page (``src/glmserve/web/``): ``GET /`` is its HTML, ``GET /ui/<file>`` its
scripts, styles and the vendored libraries (``web/vendor/``). On by default, ``--no-ui`` off.

The page holds no secret, so it is served without the API key (a browser cannot send a bearer
token when it opens a page); the page asks for the key and sends it on its API calls only.

Every response carries a Content-Security-Policy that allows scripts, styles and connections
to this origin only and images from it or ``data:``/``blob:`` URLs: a second line of defence
behind the page's HTML sanitizer, and no remote image in a reply can leak the conversation."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import APIRouter, FastAPI
from starlette.responses import FileResponse, Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

WEB_ROOT = Path(str(files("glmserve") / "web"))

SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
        "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    # revalidated every time (ETag): a page upgraded with glmserve is never mixed with old files
    "cache-control": "no-cache",
}

router = APIRouter()


@router.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
async def index() -> FileResponse:
    return FileResponse(WEB_ROOT / "index.html", media_type="text/html", headers=SECURITY_HEADERS)


class _PageFiles(StaticFiles):
    """Starlette's static files (ETag, 304s, no path outside the folder) with the page's headers."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers.update(SECURITY_HEADERS)
        return response


def install_ui(app: FastAPI) -> None:
    """Serve the chat page on ``app``: ``/`` and ``/ui/...``."""
    app.include_router(router)
    app.mount("/ui", _PageFiles(directory=WEB_ROOT, follow_symlink=False), name="ui")
