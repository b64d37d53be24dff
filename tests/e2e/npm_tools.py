"""The coding agents the e2e tests run for real, installed from the npm registry (pinned, as
their own tests pin them) into pytest's cache once per machine."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest


def npm_command(request: pytest.FixtureRequest, package: str, command: str, cache: str) -> Path:
    """The ``command`` that npm ``package`` (``NAME@VERSION``) installs, installed under pytest's
    cache folder ``cache`` unless it is there. On a machine without npm the test is skipped, but
    on CI (``CI`` set, as ``.ci/run`` runs) it fails: there the agents are part of the suite. An
    install that fails fails the test."""
    npm = shutil.which("npm")
    if npm is None:
        if os.environ.get("CI"):
            pytest.fail(f"npm is not installed: {command} is an npm package, and CI runs the real agents")
        pytest.skip(f"npm is not installed: {command} is an npm package")
    root = Path(request.config.cache.mkdir(cache))
    exe = root / "node_modules" / ".bin" / command
    if not exe.exists():
        subprocess.run([npm, "install", "--prefix", str(root), "--no-audit", "--no-fund", package], check=True,
                       capture_output=True, timeout=600)
    return exe
