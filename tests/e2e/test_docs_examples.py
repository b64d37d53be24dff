"""Every example in the docs and the README that talks to a server, run against one server on the
default model (``tests/docs_examples.py`` says which blocks those are); one test per block, named
by its page and line.

Each block runs as written, with two substitutions: the docs' server address
(``http://127.0.0.1:8000``) becomes the test server's, and ``PLACEHOLDERS`` (files an example names
on the server's machine) become the test's files. Shell blocks run under ``bash -e -o pipefail``
with ``curl`` failing on an HTTP error status (``--fail-with-body``); Python blocks run as a script.
``claude`` is Claude Code itself, installed from npm as ``test_claude_code.py`` installs it.
A block that needs more than the default model says why in a ``<!-- not run here: ... -->``
comment, and those reasons are checked to be there."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from glmserve.testing import RemoteServer
from tests.docs_examples import SERVER, examples
from tests.e2e.test_claude_code import REFUSED

RUN = [example for example in examples() if example.talks_to_server and example.not_run is None]
NOT_RUN = [example for example in examples() if example.talks_to_server and example.not_run is not None]
PLACEHOLDERS = {"/adapters/sql-lora.gguf": "gguf_adapter"}
# curl as a script should use it: an HTTP error is a failed command
CURL = 'curl() { command curl --silent --show-error --fail-with-body "$@"; }\n'


@pytest.fixture(scope="module")
def server():
    """The default model as the coding agents guide serves it for its Claude Code check (greedy
    by default: Claude Code sends no temperature), with the run-time LoRA routes the LoRA guide's
    example calls."""
    srv = RemoteServer("--override-generation-config", '{"temperature": 0}', "--allow-runtime-lora-updating")
    yield srv
    srv.stop()


def test_the_docs_have_examples_to_run():
    # the getting-started requests, the agents, tools, LoRA, chat, bench, metrics: at least these
    pages = {example.page for example in RUN}
    assert {"README.md", "docs/getting-started.md", "docs/guides/coding-agents.md", "docs/guides/tools.md",
            "docs/guides/lora.md", "docs/guides/chat-ui.md", "docs/performance/index.md"} <= pages
    assert len(RUN) >= 12


def test_examples_not_run_here_say_why():
    for example in NOT_RUN:
        assert len(example.not_run) > 20, example.id
    assert len(NOT_RUN) <= 5, [example.id for example in NOT_RUN]  # the 4th and 5th: deployment's docker runs (CPU, GPU)


@pytest.mark.parametrize("example", RUN, ids=[example.id for example in RUN])
def test_example(example, server, tmp_path, request):
    code = SERVER.sub(server.url, example.code)
    for placeholder, fixture in PLACEHOLDERS.items():
        if placeholder in code:
            code = code.replace(placeholder, str(request.getfixturevalue(fixture)))
    env = {**os.environ, "HOME": str(tmp_path), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    if "claude" in code.split():
        env["PATH"] = f"{request.getfixturevalue('claude').parent}{os.pathsep}{env['PATH']}"
    if example.language == "python":
        command = [sys.executable, "-c", code]
    else:
        command = [shutil.which("bash") or "/bin/bash", "-e", "-o", "pipefail", "-c", CURL + code]
    proc = subprocess.run(command, cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{example.id}:\n{code}\n--- output ---\n{out}\n--- server ---\n{server.log()[-3000:]}"
    assert proc.stdout.strip(), out
    assert not any(refused in out for refused in REFUSED), out
    assert "Traceback" not in server.log(), server.log()[-5000:]
