"""Headless Chromium for the web page's tests: Debian's ``chromium`` (``make test`` installs it;
``GLMSERVE_CHROMIUM`` names another binary) driven by Playwright's driver. A test tool's own
browser download does not work offline, so Playwright is only given the path.

Screenshots of the page's states go to ``build/screenshots/`` (not committed)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

SCREENSHOTS = Path(__file__).resolve().parents[2] / "build" / "screenshots"
# as the machine's own notes advise: no background connections (there is no network to reach)
CHROMIUM_ARGS = ["--disable-gpu", "--disable-quic", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]


def chromium_path() -> str:
    path = os.environ.get("GLMSERVE_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        pytest.fail("no chromium: install Debian's chromium package (make test does) or set GLMSERVE_CHROMIUM")
    return path


def launch() -> Iterator:
    """Yields a started headless Chromium (a Playwright ``Browser``); closes it after."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=chromium_path(), headless=True, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


def screenshot(page, name: str) -> Path:
    """Saves the page as ``build/screenshots/<name>.png``."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=False)
    return path
