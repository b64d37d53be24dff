"""``glmserve launch`` with the real agents (installed from npm as their own tests install them):
it starts a server with the ``serve`` flags given, points the agent at it and runs it with the
arguments after ``--``, then stops the server; the agent's answer comes back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.e2e.test_claude_code import REFUSED, claude  # noqa: F401 (the fixture)
from tests.e2e.test_codex import INSTRUCTIONS, codex  # noqa: F401 (the fixture)

SMALL = ["--n-ctx", "8192", "--max-num-seqs", "1", "--override-generation-config",
         '{"temperature": 0, "max_new_tokens": 100}']


def _launch(agent: Path, home: Path, *args: str) -> subprocess.CompletedProcess:
    """``glmserve launch ARGS`` with the agent's folder on the PATH, in an empty home."""
    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HOME": str(home), "GLMSERVE_STATE_DIR": str(home / "state"),
           "PATH": f"{agent.parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run([sys.executable, "-m", "glmserve", "launch", *args], env=env, cwd=home,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=900)


def test_launch_claude_answers(claude, tmp_path):  # noqa: F811
    proc = _launch(claude, tmp_path / "home", "claude", *SMALL, "--", "-p", "What is the capital of France?",
                   "--system-prompt", "Answer in one word.", "--tools", "")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and not any(r in out for r in REFUSED), out
    assert [line for line in proc.stdout.splitlines() if line.strip()], out
    [log] = (tmp_path / "home" / "state").glob("launch-*.log")  # the server it started, stopped again
    assert '"POST /v1/messages?beta=true HTTP/1.1" 200' in log.read_text()
    assert "Application shutdown complete" in log.read_text()


def test_launch_codex_answers(codex, tmp_path):  # noqa: F811
    instructions = tmp_path / "instructions.md"
    instructions.write_text(INSTRUCTIONS)
    proc = _launch(codex, tmp_path / "home", "codex", *SMALL, "--", "exec", "--skip-git-repo-check", "--json",
                   "-c", f"model_instructions_file={json.dumps(str(instructions))}", "Say hi")
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    messages = [e["item"]["text"] for e in events if e.get("type") == "item.completed"
                and e["item"].get("type") == "agent_message"]
    assert proc.returncode == 0 and messages and messages[-1].strip(), proc.stdout + proc.stderr
