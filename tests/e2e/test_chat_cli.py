"""``glmserve chat`` driven in a pseudo-terminal (pexpect), in-process and with --url, and piped."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pexpect
import pytest

SYSTEM = "You are a helpful AI assistant."
PROMPT = ">>>"  # prompt_toolkit draws the trailing space as a cursor move


def _spawn(*args: str) -> pexpect.spawn:
    child = pexpect.spawn(sys.executable, ["-m", "glmserve", "chat", "--temperature", "0", *args],
                          encoding="utf-8", timeout=120, dimensions=(40, 120),
                          env={**os.environ, "PROMPT_TOOLKIT_NO_CPR": "1"})
    child.expect(PROMPT)
    return child


def _save(child: pexpect.spawn, path) -> list[dict]:
    child.sendline(f"/save {path}")
    child.expect("messages saved to")
    child.expect(PROMPT)
    return json.loads(path.read_text())["messages"]


def _ask(child: pexpect.spawn, text: str) -> str:
    child.sendline(text)
    child.expect(r"\d+ tokens, ")  # the dim line after a finished reply
    answer = child.before
    child.expect(PROMPT)
    return answer


@pytest.fixture()
def local_chat():
    child = _spawn("--n-threads", "2", "--system", SYSTEM)
    yield child
    child.close(force=True)


def test_interactive_session(local_chat, tmp_path):
    child = local_chat
    assert "Paris" in _ask(child, "What is the capital of France?")

    save = tmp_path / "conv.json"
    saved = _save(child, save)
    assert [m["role"] for m in saved] == ["system", "user", "assistant"]
    assert saved[0]["content"] == SYSTEM and "Paris" in saved[2]["content"]

    child.sendline("/reset")
    child.expect("conversation cleared")
    child.expect(PROMPT)
    assert [m["role"] for m in _save(child, save)] == ["system"]

    child.sendline("/system You are a pirate. Always answer like a pirate.")
    child.expect("system prompt set")
    child.expect(PROMPT)
    assert _save(child, save)[0]["content"].startswith("You are a pirate")

    child.sendline("/load " + str(save))
    child.expect("messages loaded from")
    child.expect(PROMPT)

    child.sendline("/help")
    child.expect("/system TEXT")
    child.expect(PROMPT)

    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_ctrl_c_stops_a_reply_and_returns_to_the_prompt(tmp_path):
    # one llama.cpp thread: the terminal's live display needs the other core. The test's own
    # process may run with SIGINT ignored (a background job of a non-interactive shell, as in
    # CI), which the chat program inherits: it must stop the reply all the same.
    child = _spawn("--n-threads", "1", "--max-tokens", "3000")
    child.sendline("Count from one to one thousand, writing every number in words.")
    child.expect(r"\d+, \d+, \d+, \d+")  # the reply ("The numbers are: 1, 2, 3, ...") is streaming
    child.sendintr()
    child.expect(r"reply stopped")
    child.expect(PROMPT)
    # the interrupted turn is not kept, and the program still answers
    assert _save(child, tmp_path / "c.json") == []
    assert _ask(child, "Say hello.")
    child.sendeof()  # Ctrl-D
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_against_a_running_server(server):
    child = _spawn("--url", server.url, "--system", SYSTEM)
    try:
        assert "Paris" in _ask(child, "What is the capital of France?")
        child.sendline("/exit")
        child.expect(pexpect.EOF)
        child.close()
        assert child.exitstatus == 0
    finally:
        child.close(force=True)


def _piped(*args: str, stdin: str = "", env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "glmserve", "chat", "--temperature", "0", *args], input=stdin,
                          capture_output=True, text=True, timeout=180, env={**os.environ, **(env or {})})


def test_piped_stdin_in_process_and_remote(server):
    # a server's variables in the user's environment are that server's: chat leaves them alone
    env = {"GLMSERVE_STORE_TTL": "5s", "GLMSERVE_PORT": "9", "GLMSERVE_N_CTX": "2048"}
    for args in (["--n-threads", "2"], ["--url", server.url]):
        proc = _piped(*args, "--system", SYSTEM, stdin="What is the capital of France?\n", env=env)
        assert proc.returncode == 0, proc.stderr
        assert "Paris" in proc.stdout


def test_errors_are_one_line(server):
    for args, needle in [
        (["--url", "http://127.0.0.1:9"], "cannot reach"),
        (["--url", server.url, "--model", "nope"], "model not found"),
        (["--model", "/no/such.gguf"], "cannot load the model"),
    ]:
        proc = _piped(*args, stdin="Hi\n")
        assert proc.returncode == 1
        assert "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and needle in proc.stderr, proc.stderr
    for args, needle in [  # a flag chat does not use: the usage error's exit status
        (["--port", "9"], "does not use --port"),
        (["--url", server.url, "--n-ctx", "512"], "does not use --n-ctx"),
    ]:
        proc = _piped(*args, stdin="Hi\n")
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and needle in proc.stderr


def test_the_api_key_is_sent_and_a_wrong_one_is_one_line():
    """``--api-key KEY`` is sent as the bearer token (before, the key list was: ``['KEY']``),
    and a key the server refuses is one line."""
    from tests.conftest import RemoteServer

    srv = RemoteServer("--api-key", "right")
    try:
        proc = _piped("--url", srv.url, "--api-key", "wrong", stdin="Hi\n")
        assert proc.returncode == 1 and "refused the API key" in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
        proc = _piped("--url", srv.url, "--api-key", "right", stdin="Hi\n")
        assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr
    finally:
        srv.stop()
