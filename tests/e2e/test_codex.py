"""OpenAI's Codex CLI itself (the npm package ``@openai/codex``, pinned below), run headless
against glmserve as a user configures it: a model provider in ``$CODEX_HOME/config.toml`` with
``base_url`` at the server, ``wire_api = "responses"`` and ``env_key`` naming the variable that
holds the server's ``--api-key``; ``codex exec``. It runs offline against the server alone.

Codex's first request (captured here) carries two ``developer`` messages, ``input_text`` parts,
function tools, a ``namespace`` tool (``multi_agent_v1``), the hosted ``web_search``,
``reasoning``, ``include: ["reasoning.encrypted_content"]``, ``prompt_cache_key`` and
``client_metadata``. Its 17,000-character base instructions and 4,300 tokens of tools do not fit
the default model's 8,192-token context, so the default model is asked with short instructions
(``model_instructions_file``, Codex's own setting) and every tool Codex offers by default. The
tool round trip runs on a tiny model trained in the test on Codex's captured prompt to call
``exec_command`` and then answer (``tests/hf_models.py`` ``tiny_tool_caller``), with the hermes
fixture template and the tools Codex offers with its optional features off: Codex sends the
request, glmserve parses the model's ``<tool_call>`` into a ``function_call`` item, Codex runs the
command, sends its output back as a ``function_call_output`` and prints the model's answer."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import DEFAULT_MODEL, RemoteServer
from tests.e2e.agents import ANSWER, KEY, MARKER, TOOL_CALLER, hermes_call, tool_caller_server

CALL = hermes_call("exec_command", {"cmd": f"echo {MARKER}"})
INSTRUCTIONS = "You are Codex, a coding agent. Answer briefly."
# Codex's optional features whose tools and instructions a tiny model's prompt can do without
LEAN = ("--disable", "multi_agent", "--disable", "goals", "--disable", "view_image", "--disable", "image_generation",
        "-c", 'web_search="disabled"')


def run_codex(codex: Path, server, model: str, prompt: str, home: Path, *args: str) -> str:
    """``codex exec PROMPT`` with a provider at ``server`` serving ``model``, in ``home``
    (``CODEX_HOME`` is ``home/.codex``, the working directory ``home/work``); its output."""
    config = home / ".codex"
    config.mkdir(parents=True, exist_ok=True)
    (home / "work").mkdir(exist_ok=True)
    (config / "instructions.md").write_text(INSTRUCTIONS)
    (config / "config.toml").write_text(f'''model = "{model}"
model_provider = "glmserve"
model_instructions_file = "{config / 'instructions.md'}"

[model_providers.glmserve]
name = "glmserve"
base_url = "{server.url}/v1"
wire_api = "responses"
env_key = "GLMSERVE_API_KEY"
''')
    environ = {**os.environ, "HOME": str(home), "CODEX_HOME": str(config), "GLMSERVE_API_KEY": KEY}
    proc = subprocess.run([str(codex), "exec", "--skip-git-repo-check", *args, prompt], env=environ,
                          cwd=home / "work", stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600)
    return proc.stdout + proc.stderr


def test_codex_exec_gets_an_answer_from_the_default_model(codex, tmp_path):
    srv = RemoteServer("--api-key", KEY, "--n-ctx", "8192", "--log-level", "info",
                       "--override-generation-config", '{"temperature": 0, "max_new_tokens": 100}')
    try:
        out = run_codex(codex, srv, DEFAULT_MODEL, "Say hi", tmp_path, "--json")
        events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        messages = [e["item"]["text"] for e in events if e.get("type") == "item.completed"
                    and e["item"].get("type") == "agent_message"]
        assert messages and messages[-1].strip(), out
        log = srv.log()
        assert '"POST /v1/responses HTTP/1.1" 200' in log, log[-3000:]
        assert "hosted tools left out (nothing here runs them): web_search" in log  # and its namespace tool was served
    finally:
        srv.stop()


def agent_prompt(body: dict) -> tuple[list[dict], list[dict]]:
    """A Responses request as the template messages and tools glmserve renders for it."""
    from glmserve.chat.messages import to_template_messages
    from glmserve.protocol.responses import ResponsesRequest
    from glmserve.serving.responses.request import function_tools, to_chat_request

    def no_sealed_reasoning(token: str, param: str) -> str:  # Codex's first request has no history
        raise AssertionError(f"unexpected encrypted_content at {param}")

    req = ResponsesRequest.model_validate(body)
    chat = to_chat_request(req, function_tools(req)[0], no_sealed_reasoning)
    return to_template_messages(chat.messages), chat.model_dump(exclude_none=True)["tools"]


def test_codex_runs_a_command_the_model_called(codex, smollm2_hf, tmp_path_factory, agent_home):
    pytest.importorskip("torch")
    home = agent_home
    prompt = f"Run the shell command: echo {MARKER}"
    args = (*LEAN, "--json", "--dangerously-bypass-approvals-and-sandbox")
    # the request Codex will send, from the same home, on the same day, trains the tool caller
    refusal = {"error": {"message": "captured", "type": "invalid_request_error", "param": None, "code": None}}
    with tool_caller_server(lambda srv: run_codex(codex, srv, TOOL_CALLER, prompt, home, *args), "/v1/responses",
                            refusal, smollm2_hf, tmp_path_factory.mktemp("codex-caller"), CALL, agent_prompt) as srv:
        out = run_codex(codex, srv, TOOL_CALLER, prompt, home, *args)
    events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    items = [e["item"] for e in events if e.get("type") == "item.completed"]
    commands = [i for i in items if i.get("type") == "command_execution"]
    assert commands and MARKER in commands[0]["command"] and MARKER in commands[0]["aggregated_output"], out
    answers = [i["text"] for i in items if i.get("type") == "agent_message"]
    assert answers and answers[-1] == ANSWER, out
