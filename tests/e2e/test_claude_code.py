"""Claude Code itself (the npm package ``@anthropic-ai/claude-code``, pinned below), run headless
against glmserve as a user would: ``ANTHROPIC_BASE_URL`` at the server, ``ANTHROPIC_API_KEY`` as
the server's ``--api-key``, ``claude -p``. It runs offline: with non-essential traffic off it
talks to the server only (``shared/reference/anthropic/CLAUDE-CODE.md``).

Claude Code's own prompt (system text and 24 tool schemas, ~12k tokens) does not fit the default
model's context, and on this 2-core machine a 135M model takes minutes over it, so the default
model is asked with ``--system-prompt`` and no tools. The tool round trip runs on a tiny model
trained in the test to call ``Bash`` and then answer (``tests/hf_models.py``
``tiny_tool_caller``), with the hermes fixture template: Claude Code sends the request, glmserve
parses the model's ``<tool_call>`` into a ``tool_use`` block, Claude Code runs the command and
sends its output back as a ``tool_result``, and prints the model's final answer."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import DEFAULT_MODEL, RemoteServer
from tests.e2e.agents import ANSWER, KEY, MARKER, TOOL_CALLER, hermes_call, tool_caller_server

CALL = hermes_call("Bash", {"command": f"echo {MARKER}"})
# what Claude Code prints when the server refuses its request (it still exits 0)
REFUSED = ("There's an issue with the selected model", "API Error")


def run_claude(claude: Path, server: RemoteServer, model: str, prompt: str, home: Path, *args: str,
               env: dict[str, str] | None = None) -> str:
    """``claude -p PROMPT --model MODEL ARGS`` against ``server``, in an empty home; its output."""
    home.mkdir(parents=True, exist_ok=True)
    environ = {**os.environ, "HOME": str(home), "ANTHROPIC_BASE_URL": server.url, "ANTHROPIC_API_KEY": KEY,
               "DISABLE_TELEMETRY": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", **(env or {})}
    proc = subprocess.run([str(claude), "-p", prompt, "--model", model, *args], env=environ, cwd=home,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600)
    return proc.stdout + proc.stderr


def test_claude_code_gets_an_answer_from_the_default_model(claude, tmp_path):
    # Claude Code sends no temperature: greedy by the server's default, so the reply is short and the
    # same every run (sampled, a 135M model can write to the end of the context)
    srv = RemoteServer("--api-key", KEY, "--override-generation-config", '{"temperature": 0}')
    try:
        out = run_claude(claude, srv, DEFAULT_MODEL, "What is the capital of France?", tmp_path / "home",
                         "--system-prompt", "You are a helpful AI assistant.", "--tools", "")
        assert not any(r in out for r in REFUSED), out
        assert '"POST /v1/messages?beta=true HTTP/1.1" 200' in srv.log(), srv.log()[-3000:]
        answer = [line for line in out.splitlines() if line.strip() and "claude-code:" not in line
                  and "recognize the model" not in line]
        assert answer, out
    finally:
        srv.stop()


def agent_prompt(body: dict) -> tuple[list[dict], list[dict]]:
    """A Messages request as the template messages and tools glmserve renders for it."""
    from glmserve.chat.messages import to_template_messages
    from glmserve.protocol.anthropic import MessagesRequest
    from glmserve.serving.messages.request import to_chat_request

    chat = to_chat_request(MessagesRequest.model_validate(body))
    return to_template_messages(chat.messages), chat.model_dump(exclude_none=True)["tools"]


def test_claude_code_runs_a_tool_the_model_called(claude, smollm2_hf, tmp_path_factory, agent_home):
    pytest.importorskip("torch")
    home = agent_home
    prompt = f"Run the shell command: echo {MARKER}"
    args = ("--system-prompt", "You are a helpful AI assistant.", "--tools", "Bash", "--allowedTools", "Bash",
            "--max-turns", "3", "--output-format", "stream-json", "--verbose")
    # the request Claude Code will send, from the same home, on the same day, trains the tool caller
    refusal = {"type": "error", "error": {"type": "invalid_request_error", "message": "captured"}}
    with tool_caller_server(lambda srv: run_claude(claude, srv, TOOL_CALLER, prompt, home, *args), "/v1/messages",
                            refusal, smollm2_hf, tmp_path_factory.mktemp("tool-caller"), CALL, agent_prompt) as srv:
        out = run_claude(claude, srv, TOOL_CALLER, prompt, home, *args)
    events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    blocks = [(e["type"], b) for e in events if e.get("type") in ("assistant", "user")
              for b in e["message"]["content"] if isinstance(b, dict)]
    uses = [b for kind, b in blocks if b.get("type") == "tool_use"]
    assert uses and uses[0]["name"] == "Bash" and uses[0]["input"]["command"] == f"echo {MARKER}", out
    results = [b for kind, b in blocks if b.get("type") == "tool_result"]
    assert results and results[0]["tool_use_id"] == uses[0]["id"] and MARKER in json.dumps(results[0]), out
    final = [e for e in events if e.get("type") == "result"]
    assert final and final[-1].get("result") == ANSWER, out
