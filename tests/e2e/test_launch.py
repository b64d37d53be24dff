"""``glmserve launch`` with the real agents (installed from npm as their own tests install them):
it starts a server with the ``serve`` flags given, points the agent at it and runs it with the
arguments after ``--``, then stops the server; the agent's answer comes back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

from tests.e2e.test_claude_code import REFUSED, claude  # noqa: F401 (the fixture)
from tests.e2e.test_codex import INSTRUCTIONS, codex  # noqa: F401 (the fixture)

SMALL = ["--n-ctx", "8192", "--max-num-seqs", "1", "--override-generation-config",
         '{"temperature": 0, "max_new_tokens": 100}']


def _launch(agent: Path, home: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``glmserve launch ARGS`` with the agent's folder on the PATH, in an empty home, ``env`` added."""
    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HOME": str(home), "GLMSERVE_STATE_DIR": str(home / "state"),
           "PATH": f"{agent.parent}{os.pathsep}{os.environ['PATH']}", **(env or {})}
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


# an agent that keeps what glmserve launch gave it (its environment and config files) in $RECORD
RECORDER = """#!/bin/sh
env > "$RECORD/env"
if [ -n "$CODEX_HOME" ]; then cp "$CODEX_HOME/config.toml" "$RECORD/config.toml"; fi
if [ -n "$OPENCODE_CONFIG" ]; then cp "$OPENCODE_CONFIG" "$RECORD/opencode.json"; fi
"""


def test_launch_serves_the_models_own_context_unless_set_and_tells_the_agent(tmp_path):
    """Without --n-ctx the server serves the model's training context (the default model's 8192,
    below what an agent's session needs: a warning says so); --n-ctx or GLMSERVE_N_CTX set it. Each
    agent gets the context in its own setting, read back from what it was given."""
    bin_, record = tmp_path / "bin", tmp_path / "record"
    bin_.mkdir()
    record.mkdir()
    for name in ("claude", "codex", "opencode"):
        (bin_ / name).write_text(RECORDER)
        (bin_ / name).chmod(0o755)
    env = {"RECORD": str(record)}
    proc = _launch(bin_ / "codex", tmp_path / "home", "codex", "--max-num-seqs", "1", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "with a context of 8192 tokens" in proc.stderr and "warning: codex's own prompt" in proc.stderr
    config = tomllib.loads((record / "config.toml").read_text())
    assert (config["model_context_window"], config["model_auto_compact_token_limit"]) == (8192, 7372)
    proc = _launch(bin_ / "opencode", tmp_path / "home", "opencode", "--max-num-seqs", "1",
                   env={**env, "GLMSERVE_N_CTX": "4096"})
    assert proc.returncode == 0 and "with a context of 4096 tokens" in proc.stderr, proc.stderr
    limit = json.loads((record / "opencode.json").read_text())["provider"]["glmserve"]["models"]
    assert [m["limit"] for m in limit.values()] == [{"context": 4096, "output": 1024}]
    proc = _launch(bin_ / "claude", tmp_path / "home", "claude", "--n-ctx", "40960", "--max-num-seqs", "1", env=env)
    assert proc.returncode == 0 and "warning" not in proc.stderr, proc.stderr
    given = dict(line.split("=", 1) for line in (record / "env").read_text().splitlines() if "=" in line)
    assert (given["CLAUDE_CODE_AUTO_COMPACT_WINDOW"], given["CLAUDE_CODE_MAX_OUTPUT_TOKENS"]) == ("40960", "10240")
