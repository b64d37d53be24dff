"""The web chat page over plain HTTP: served at ``/`` with its files under ``/ui/`` (no API key
needed, a strict Content-Security-Policy, ETags), nothing outside its folder, ``--no-ui`` turns
it off; model cards say what a model takes (``capabilities``). The page itself is tested in a
browser in ``test_web_ui.py``."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from tests.conftest import RemoteServer

WEB = Path(__file__).resolve().parents[2] / "src" / "glmserve" / "web"


@pytest.fixture(scope="module")
def keyed():
    server = RemoteServer("--api-key", "sk-page")
    yield server
    server.stop()


def _assets(html: str) -> list[str]:
    return re.findall(r'(?:src|href)="(/ui/[^"]+)"', html)


def test_page_and_every_file_it_loads(server):
    page = httpx.get(f"{server.url}/")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "default-src 'none'" in csp and "connect-src 'self'" in csp
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert page.headers["x-content-type-options"] == "nosniff"
    head = httpx.head(f"{server.url}/")
    assert head.status_code == 200 and head.content == b"" and head.headers["content-type"].startswith("text/html")
    assets = _assets(page.text)
    assert "/ui/app.js" in assets and "/ui/app.css" in assets
    # the modules the page imports, and the modules they import, all come from this server
    pending, seen = list(assets), set()
    while pending:
        path = pending.pop()
        if path in seen:
            continue
        seen.add(path)
        resp = httpx.get(f"{server.url}{path}")
        assert resp.status_code == 200, path
        assert resp.headers["content-security-policy"] == csp
        if path.endswith((".js", ".mjs")):
            assert "javascript" in resp.headers["content-type"], (path, resp.headers["content-type"])
            base = path.rsplit("/", 1)[0]
            for spec in re.findall(r'^import .* from "(\./[^"]+)";', resp.text, flags=re.M):
                pending.append(f"{base}/{spec[2:]}")
    assert {"/ui/vendor/marked.esm.js", "/ui/vendor/purify.es.mjs", "/ui/vendor/highlight.min.js"} <= seen
    # (that the page fetches nothing from another site is checked in the browser, test_web_ui.py)


def test_files_revalidate_with_etags(server):
    first = httpx.get(f"{server.url}/ui/app.js")
    assert first.headers["cache-control"] == "no-cache"
    again = httpx.get(f"{server.url}/ui/app.js", headers={"If-None-Match": first.headers["etag"]})
    assert again.status_code == 304


@pytest.mark.parametrize("path", ["/ui/nope.js", "/ui/../settings.py", "/ui/%2e%2e/settings.py", "/ui/vendor/../../cli.py"])
def test_nothing_outside_the_page_folder(server, path):
    resp = httpx.get(f"{server.url}{path}")
    assert resp.status_code == 404
    assert resp.json()["error"]["type"] == "not_found_error"


def test_page_needs_no_key_but_the_api_does(keyed):
    assert httpx.get(f"{keyed.url}/").status_code == 200
    assert httpx.get(f"{keyed.url}/ui/app.js").status_code == 200
    assert httpx.get(f"{keyed.url}/v1/models").status_code == 401
    assert httpx.get(f"{keyed.url}/v1/models", headers={"Authorization": "Bearer sk-page"}).status_code == 200


def test_no_ui_turns_the_page_off():
    server = RemoteServer("--no-ui")
    try:
        for path in ("/", "/ui/app.js"):
            resp = httpx.get(f"{server.url}{path}")
            assert resp.status_code == 404
            assert resp.json()["error"]["message"] == f"Invalid URL (GET {path})"
        assert httpx.get(f"{server.url}/v1/models").status_code == 200
    finally:
        server.stop()


def test_model_card_capabilities(client):
    (card,) = client.models.list().data
    # the default model has a chat template without tools: the generic tool format, no images;
    # llama_cpp embeds
    assert card.model_extra["capabilities"] == ["completion", "tools", "embedding"]


def test_package_ships_every_page_file():
    """setuptools' package-data must list each kind of file the page folder holds."""
    import tomllib

    patterns = tomllib.loads((WEB.parents[2] / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    shipped = {p for pattern in patterns["glmserve"] for p in WEB.parent.glob(pattern)}
    files = {p for p in WEB.rglob("*") if p.is_file()}
    assert files <= shipped, sorted(str(p.relative_to(WEB)) for p in files - shipped)
