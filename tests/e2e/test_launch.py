"""``glmserve launch`` with the real agents (installed from npm as their own tests install them):
it starts a server with the ``serve`` flags given, points the agent at it and runs it with the
arguments after ``--``, then stops the server; the agent's answer comes back. Each agent runs in
a home and a project whose own configuration points it at a decoy server (as a cloud GLM plan's
set-up writes it), which must receive nothing. With a stand-in agent: the key, the context, a
model by name fetched first, the launch logs kept, and the signals (SIGTERM leaves no process
behind; a Ctrl-C is the agent's, not the server's)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from glmserve.models import default_model_path
from tests.e2e.test_claude_code import REFUSED
from tests.e2e.test_codex import INSTRUCTIONS, LEAN
from tests.hub_site import Hub, hub_site

SMALL = ["--n-ctx", "8192", "--max-num-seqs", "1", "--override-generation-config",
         '{"temperature": 0, "max_new_tokens": 100}']
# OpenCode sends max_tokens, the launch's output limit (a quarter of the context), to its build
# agent and its title agent: the greedy model wrote 2048 tokens for each at 8192 (57 s of a suite
# run, 15 s where the prompt's working directory made it stop early); its prompt here is short
OPENCODE_SMALL = ["--n-ctx", "2048", *SMALL[2:]]


@contextmanager
def decoy() -> Iterator[tuple[str, list[str]]]:
    """A server that records every request it gets (and answers 500); yields (URL, requests)."""
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def _any(self) -> None:
            seen.append(f"{self.command} {self.path}")
            self.send_response(500)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_POST = do_HEAD = _any  # noqa: N815 (http.server's names)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def _launch(agent: Path, home: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``glmserve launch ARGS`` with the agent's folder on the PATH, in ``home`` (also the
    working directory: the project), ``env`` added."""
    home.mkdir(parents=True, exist_ok=True)
    return subprocess.run([sys.executable, "-m", "glmserve", "launch", *args], env=_env(agent, home, env), cwd=home,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=900)


def _env(agent: Path, home: Path, env: dict[str, str] | None) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("GLMSERVE_")}
    return {**environ, "HOME": str(home), "GLMSERVE_STATE_DIR": str(home / "state"),
            "PATH": f"{agent.parent}{os.pathsep}{os.environ['PATH']}", **(env or {})}


def _server_log(home: Path) -> str:
    [log] = (home / "state").glob("launch-*.log")  # the server it started
    return log.read_text()


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_launch_claude_answers_over_the_users_and_the_projects_settings(claude, tmp_path):  # noqa: F811
    home = tmp_path / "home"
    with decoy() as (elsewhere, seen):
        cloud = json.dumps({"env": {"ANTHROPIC_BASE_URL": elsewhere, "ANTHROPIC_AUTH_TOKEN": "cloud-token",
                                    "ANTHROPIC_MODEL": "glm-4.7", "CLAUDE_CODE_USE_BEDROCK": "1"},
                            "apiKeyHelper": "echo helper-key"})
        for settings in (".claude/settings.json", ".claude/settings.local.json"):  # the user's; the project's
            _write(home / settings, cloud)
        _write(home / ".claude.json", json.dumps({"hasCompletedOnboarding": True}))
        proc = _launch(claude, home, "claude", *SMALL, "--", "-p", "What is the capital of France?",
                       "--system-prompt", "Answer in one word.", "--tools", "",
                       env={"ANTHROPIC_AUTH_TOKEN": "env-token", "ANTHROPIC_BASE_URL": elsewhere})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and not any(r in out for r in REFUSED), out
    assert [line for line in proc.stdout.splitlines() if line.strip()], out
    assert seen == []
    log = _server_log(home)  # the server it started (with the launch's key: a 401 otherwise), stopped again
    assert '"POST /v1/messages?beta=true HTTP/1.1" 200' in log and " 401" not in log
    assert "Application shutdown complete" in log


def test_launch_codex_answers_and_keeps_the_users_codex_home(codex, tmp_path):  # noqa: F811
    home = tmp_path / "home"
    instructions = tmp_path / "instructions.md"
    instructions.write_text(INSTRUCTIONS)
    with decoy() as (elsewhere, seen):
        users = (f'model = "glm-4.7"\nmodel_provider = "cloud"\n\n[model_providers.cloud]\nname = "cloud"\n'
                 f'base_url = "{elsewhere}/v1"\nwire_api = "responses"\n\n[model_providers.glmserve]\n'
                 f'name = "glmserve"\nbase_url = "{elsewhere}/v1"\nwire_api = "chat"\n')
        _write(home / ".codex" / "config.toml", users)
        _write(home / ".codex" / "AGENTS.md", "Answer briefly.")
        proc = _launch(codex, home, "codex", *SMALL, "--", "exec", "--skip-git-repo-check", "--json", *LEAN,
                       "-c", f"model_instructions_file={json.dumps(str(instructions))}", "Say hi",
                       env={"OPENAI_BASE_URL": elsewhere})
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    messages = [e["item"]["text"] for e in events if e.get("type") == "item.completed"
                and e["item"].get("type") == "agent_message"]
    assert proc.returncode == 0 and messages and messages[-1].strip(), proc.stdout + proc.stderr
    assert seen == []
    assert '"POST /v1/responses HTTP/1.1" 200' in _server_log(home)
    # the user's CODEX_HOME: its config untouched, the session kept there (codex resume finds it)
    assert (home / ".codex" / "config.toml").read_text() == users
    assert list((home / ".codex" / "sessions").rglob("rollout-*.jsonl"))


def test_launch_opencode_answers_over_the_projects_config(opencode, tmp_path):
    home = tmp_path / "home"
    with decoy() as (elsewhere, seen):
        theirs = json.dumps({"$schema": "https://opencode.ai/config.json", "model": "cloud/glm-4.7",
                             "small_model": "cloud/glm-4.7", "enabled_providers": ["cloud"],
                             "disabled_providers": ["glmserve"],
                             "provider": {"cloud": {"npm": "@ai-sdk/openai-compatible", "name": "cloud",
                                                    "options": {"baseURL": elsewhere + "/v1", "apiKey": "cloud-key"},
                                                    "models": {"glm-4.7": {"name": "glm-4.7"}}},
                                          "glmserve": {"options": {"baseURL": elsewhere + "/v1"}}},
                             # a short prompt (OpenCode's own is ~10k tokens, a minute or two on the CPU here)
                             "tools": {"*": False}, "agent": {"build": {"prompt": "Answer in one word."},
                                                              "title": {"prompt": "Answer in one word."}}})
        _write(home / "opencode.json", theirs)  # the project's
        _write(home / ".config" / "opencode" / "opencode.json", theirs)  # the user's
        _write(tmp_path / "custom.json", theirs)
        proc = _launch(opencode, home, "opencode", *OPENCODE_SMALL, "--", "run", "Say hi",
                       env={"OPENCODE_CONFIG": str(tmp_path / "custom.json")})
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert '"POST /v1/chat/completions HTTP/1.1" 200' in _server_log(home)
        # the configuration OpenCode resolved, as it prints it
        proc = _launch(opencode, home, "opencode", "--n-ctx", "2048", "--", "debug", "config",
                       env={"OPENCODE_CONFIG": str(tmp_path / "custom.json")})
    assert seen == []
    resolved = json.loads(proc.stdout[proc.stdout.index("{"):])
    assert (resolved["model"], resolved["small_model"]) == ("glmserve/SmolLM2-135M-Instruct",) * 2, proc.stdout
    assert resolved["enabled_providers"] == ["glmserve"] and resolved["disabled_providers"] == []
    assert resolved["provider"]["glmserve"]["options"]["baseURL"].startswith("http://127.0.0.1:")
    assert resolved["provider"]["glmserve"]["options"]["baseURL"] != elsewhere + "/v1"


# a stand-in agent: keeps what glmserve launch gave it (its environment and arguments) in $RECORD,
# and what the server answers without the key and with it; with $HOLD, it waits to be signalled
RECORDER = f"""#!/bin/sh
env > "$RECORD/env"
printf '%s\\n' "$@" > "$RECORD/args"
prev=""
for word in "$@"; do
  if [ "$prev" = "--settings" ]; then cp "$word" "$RECORD/settings.json"; fi
  prev="$word"
done
echo $$ > "$RECORD/pid"
URL="$ANTHROPIC_BASE_URL"
KEY="$ANTHROPIC_API_KEY"
if [ -z "$URL" ]; then
  URL=$(printf '%s' "$OPENCODE_CONFIG_CONTENT" | {sys.executable} -c \\
    'import json,sys; print(json.load(sys.stdin)["provider"]["glmserve"]["options"]["baseURL"][:-3])')
  KEY="$GLMSERVE_API_KEY"
fi
curl -s -o /dev/null -w '%{{http_code}}' "$URL/v1/models" > "$RECORD/without-key"
curl -s -o /dev/null -w '%{{http_code}}' -H "Authorization: Bearer $KEY" "$URL/v1/models" > "$RECORD/with-key"
if [ -n "$HOLD" ]; then
  trap 'sleep 1; curl -s -o /dev/null -w "%{{http_code}}" -H "Authorization: Bearer $KEY" "$URL/v1/models" \\
    > "$RECORD/after-ctrl-c"; exit 3' INT
  trap 'echo term > "$RECORD/term"; exit 4' TERM
  touch "$RECORD/holding"
  sleep 600 &
  wait $!
fi
"""


@pytest.fixture
def stand_in(tmp_path) -> tuple[Path, Path]:
    """(the stand-in agent's folder, where it records)."""
    bin_, record = tmp_path / "bin", tmp_path / "record"
    bin_.mkdir()
    record.mkdir()
    for name in ("claude", "codex", "opencode"):
        (bin_ / name).write_text(RECORDER)
        (bin_ / name).chmod(0o755)
    return bin_, record


def _given(record: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in (record / "env").read_text().splitlines() if "=" in line)


def test_launch_serves_the_models_own_context_unless_set_and_tells_the_agent(stand_in, tmp_path):
    """Without --n-ctx the server serves the model's training context (the default model's 8192,
    below what an agent's session needs: a warning says so); --n-ctx or GLMSERVE_N_CTX set it. Each
    agent gets the context in its own setting, read back from what it was given."""
    bin_, record = stand_in
    env = {"RECORD": str(record)}
    proc = _launch(bin_ / "codex", tmp_path / "home", "codex", "--max-num-seqs", "1", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "with a context of 8192 tokens" in proc.stderr and "warning: codex's own prompt" in proc.stderr
    args = (record / "args").read_text().splitlines()
    overrides = tomllib.loads("\n".join(args[i + 1] for i, word in enumerate(args) if word == "-c"))
    assert (overrides["model_context_window"], overrides["model_auto_compact_token_limit"]) == (8192, 7372)
    assert overrides["model_provider"] == "glmserve" and overrides["model_providers"]["glmserve"]["wire_api"] == \
        "responses"
    assert "CODEX_HOME" not in _given(record)
    proc = _launch(bin_ / "opencode", tmp_path / "home", "opencode", "--max-num-seqs", "1",
                   env={**env, "GLMSERVE_N_CTX": "4096"})
    assert proc.returncode == 0 and "with a context of 4096 tokens" in proc.stderr, proc.stderr
    config = json.loads(_given(record)["OPENCODE_CONFIG_CONTENT"])
    assert [m["limit"] for m in config["provider"]["glmserve"]["models"].values()] == [{"context": 4096,
                                                                                        "output": 1024}]
    proc = _launch(bin_ / "claude", tmp_path / "home", "claude", "--n-ctx", "40960", "--max-num-seqs", "1", env=env)
    assert proc.returncode == 0 and "warning" not in proc.stderr, proc.stderr
    given, settings = _given(record), json.loads((record / "settings.json").read_text())["env"]
    assert (given["CLAUDE_CODE_AUTO_COMPACT_WINDOW"], given["CLAUDE_CODE_MAX_OUTPUT_TOKENS"]) == ("40960", "10240")
    assert {k: v for k, v in settings.items() if k in given} == {k: given[k] for k in settings if k in given}
    assert settings["ANTHROPIC_BASE_URL"].startswith("http://127.0.0.1:") and settings["ANTHROPIC_AUTH_TOKEN"] == ""


def test_a_launched_server_takes_only_the_launchs_key(stand_in, tmp_path):
    """No --api-key: a random key per launch, which the server requires and the agent is given;
    --api-key a,b: the agent gets a. The launch logs beyond the newest 10 are removed."""
    bin_, record = stand_in
    home = tmp_path / "home"
    (home / "state").mkdir(parents=True)
    for i in range(12):
        (home / "state" / f"launch-{i}.log").write_text("old")
        os.utime(home / "state" / f"launch-{i}.log", (i, i))
    keys = []
    for _ in range(2):
        proc = _launch(bin_ / "claude", home, "claude", "--n-ctx", "2048", env={"RECORD": str(record)})
        assert proc.returncode == 0, proc.stderr
        assert ((record / "without-key").read_text(), (record / "with-key").read_text()) == ("401", "200")
        keys.append(_given(record)["ANTHROPIC_API_KEY"])
        assert "ANTHROPIC_AUTH_TOKEN" not in _given(record)
    assert len(set(keys)) == 2 and all(len(key) >= 32 for key in keys)
    logs = sorted(p.name for p in (home / "state").glob("launch-*.log"))
    assert len(logs) == 10 and "launch-11.log" in logs and "launch-2.log" not in logs
    proc = _launch(bin_ / "opencode", home, "opencode", "--n-ctx", "2048", "--api-key", "first,second",
                   env={"RECORD": str(record)})
    assert proc.returncode == 0, proc.stderr
    assert _given(record)["GLMSERVE_API_KEY"] == "first" and (record / "with-key").read_text() == "200"


def test_a_model_by_name_is_fetched_before_the_server_starts(stand_in, tmp_path):
    bin_, record = stand_in
    repo = "test-org/SmolLM2-135M-Instruct-GGUF"
    site = Hub({repo: {"SmolLM2-135M-Instruct-UD-Q8_K_XL.gguf": default_model_path().read_bytes()}})
    with hub_site(site) as url:
        proc = _launch(bin_ / "claude", tmp_path / "home", "claude", "--model", f"{repo}:UD-Q8_K_XL", "--n-ctx",
                       "2048", env={"RECORD": str(record), "HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": url})
    assert proc.returncode == 0, proc.stderr
    said = proc.stderr.splitlines()
    fetched = next(i for i, line in enumerate(said) if "downloading SmolLM2-135M-Instruct-UD-Q8_K_XL.gguf" in line
                   and "(100%)" in line)
    assert fetched < next(i for i, line in enumerate(said) if "starting the server" in line), proc.stderr
    assert _given(record)["ANTHROPIC_MODEL"] == repo


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return not status.exists() or "zombie" not in status.read_text()


def _held(bin_: Path, record: Path, home: Path) -> tuple[subprocess.Popen, int, int]:
    """A launch whose stand-in agent holds, in a process group of its own (as a terminal's
    foreground job); (the launcher, the agent's pid, the server's pid) once the agent holds."""
    launcher = subprocess.Popen([sys.executable, "-m", "glmserve", "launch", "claude", "--n-ctx", "2048"],
                                env=_env(bin_ / "claude", home, {"RECORD": str(record), "HOLD": "1"}), cwd=home,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
    said = launcher.stderr.readline()
    assert "starting the server on http://127.0.0.1:" in said, said
    port = int(said.split("http://127.0.0.1:")[1].split()[0])
    with pytest.raises(OSError, match="Address already in use"):  # the launch holds its port from the start:
        socket.create_server(("127.0.0.1", port)).close()  # no other local user can answer in its place
    deadline = time.monotonic() + 300
    while not (record / "holding").exists():
        assert launcher.poll() is None and time.monotonic() < deadline, launcher.communicate()
        time.sleep(0.2)
    server = int(next(line for line in _server_log(home).splitlines() if "Started server process" in line)
                 .split("[")[1].split("]")[0])
    # neither the port nor the key is on the server's command line, and its log is the user's alone
    command = Path(f"/proc/{server}/cmdline").read_bytes().split(b"\0")
    assert b"--fd" in command and b"--port" not in command and b"--api-key" not in command
    assert _given(record)["ANTHROPIC_API_KEY"].encode() not in b" ".join(command)
    assert (home / "state" / f"launch-{port}.log").stat().st_mode & 0o777 == 0o600
    return launcher, int((record / "pid").read_text()), server


def test_sigterm_to_the_launcher_leaves_no_process_behind(stand_in, tmp_path):
    bin_, record = stand_in
    home = tmp_path / "home"
    home.mkdir()
    launcher, agent, server = _held(bin_, record, home)
    launcher.send_signal(signal.SIGTERM)
    assert launcher.wait(timeout=120) == 4  # the agent's status: it got the SIGTERM and exited
    assert (record / "term").exists()
    assert not _alive(agent) and not _alive(server)
    assert "Application shutdown complete" in _server_log(home)


def test_a_launcher_killed_outright_takes_its_server_with_it(stand_in, tmp_path):
    bin_, record = stand_in
    home = tmp_path / "home"
    home.mkdir()
    launcher, agent, server = _held(bin_, record, home)
    launcher.kill()  # SIGKILL: no handler runs
    launcher.wait(timeout=60)
    [work] = Path(tempfile.gettempdir()).glob(f"glmserve-claude-{launcher.pid}-*")  # with the key, left behind
    _launch(bin_ / "codex", home, "codex", "--url", "http://127.0.0.1:9", env={"RECORD": str(record)})
    assert not work.exists()  # removed by the next launch
    deadline = time.monotonic() + 120
    while _alive(server) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(server)
    os.kill(agent, signal.SIGKILL)  # the agent is the terminal's, as after any shell job


def test_a_ctrl_c_is_the_agents_and_does_not_reach_the_server(stand_in, tmp_path):
    bin_, record = stand_in
    home = tmp_path / "home"
    home.mkdir()
    launcher, agent, server = _held(bin_, record, home)
    # the terminal's Ctrl-C goes to its foreground process group: the launcher's and the agent's,
    # never the server's own
    assert os.getpgid(agent) == os.getpgid(launcher.pid) != os.getpgid(server)
    os.killpg(launcher.pid, signal.SIGINT)
    assert launcher.wait(timeout=120) == 3  # the agent's own exit, a second after the Ctrl-C
    assert (record / "after-ctrl-c").read_text() == "200"  # the server still served then
    assert not _alive(agent) and not _alive(server)
