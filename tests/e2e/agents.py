"""What the tests of the real coding agents share (Claude Code, Codex, OpenCode: ``test_claude_code``,
``test_codex``, ``test_launch``, ``test_docs_examples``): the npm packages they pin, the key they
send, and the tool round trip's harness, ``tool_caller_server``: capture the agent's first
request, train a tiny model on the prompt glmserve renders for it to call a tool and then answer
(``tests/hf_models.py`` ``tiny_tool_caller``), and serve that model as the agent's server. The
agents' fixtures (``claude``, ``codex``, ``opencode``: each installed from npm into pytest's
cache once) are in ``tests/e2e/conftest.py``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.conftest import RemoteServer
from tests.e2e.capture import Capture

CLAUDE_CODE = "@anthropic-ai/claude-code@2.1.330"
CODEX = "@openai/codex@0.169.0"
OPENCODE = "opencode-ai@1.18.33"
KEY = "test-key"
MARKER = "glmserve-was-here"
ANSWER = f"The command printed {MARKER}."
TOOL_CALLER = "tiny-caller"  # the tool caller's served name


def hermes_call(name: str, arguments: dict[str, Any]) -> str:
    """The tool caller's call of ``name`` in the hermes format (the fixture template's)."""
    import json

    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


@contextmanager
def tool_caller_server(run_agent: Callable[[Any], object], path: str, refusal: dict, smollm2_hf: Path,
                       folder: Path, call: str,
                       render: Callable[[dict], tuple[list[dict], list[dict]]]) -> Iterator[RemoteServer]:
    """A server of a tiny model trained to answer the agent's prompt with ``call`` (then
    ``ANSWER``). ``run_agent(server)`` runs the agent once against a capture of ``path`` that
    answers ``refusal``; ``render(body)``: the template messages and tools glmserve renders for
    the request captured; ``folder``: where the model is written. The server takes ``KEY``, serves the model as ``TOOL_CALLER`` on
    the transformers engine with the hermes parser, greedy, and is stopped on exit."""
    from tests.hf_models import tiny_tool_caller

    capture = Capture(path, refusal)
    try:
        run_agent(capture)
    finally:
        capture.stop()
    assert capture.bodies, f"the agent sent no request to {path}"
    model = tiny_tool_caller(smollm2_hf, folder / TOOL_CALLER, call, ANSWER, agent=render(capture.bodies[0]))
    srv = RemoteServer("--engine", "transformers", "--model", str(model), "--served-model-name", TOOL_CALLER,
                       "--tool-call-parser", "hermes", "--n-ctx", "8192", "--api-key", KEY,
                       "--override-generation-config", '{"temperature": 0}')
    try:
        yield srv
    finally:
        srv.stop()
