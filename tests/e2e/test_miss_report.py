"""The miss report on the real server (llama_cpp, the default model, its own prefix cache): two
Claude Code sessions' first requests, whose system prompts differ only in the attribution
line's per-session suffix. With the line kept (``--prompt-normalize none``) the second session's
prefill starts inside the system prompt, and its usage, response header and debug log say so;
with the line removed (the default) its cached prefix holds the whole system prompt and the
prefill starts at its own question."""

from __future__ import annotations

import anthropic
import pytest

from glmserve.testing import DEFAULT_MODEL, RemoteServer

SESSIONS = ("x-anthropic-billing-header: cc_version=2.1.330.0d5; cc_entrypoint=sdk-cli;",
            "x-anthropic-billing-header: cc_version=2.1.330.aad; cc_entrypoint=sdk-cli;")
# a system prompt long enough that a cache of it is worth something (about 400 tokens)
REST = "You are a coding agent. " + " ".join(f"Rule {i}: read the file before you change it." for i in range(40))
QUESTIONS = ("What is two plus two?", "List the files here.")


@pytest.fixture(scope="module")
def kept():
    """A server that keeps the attribution line, logging its reports (debug on glmserve.prompt)."""
    srv = RemoteServer("--prompt-normalize", "none", "--log-level", "debug")
    yield srv
    srv.stop()


def _sessions(srv: RemoteServer) -> list[tuple[dict, str]]:
    """Each session's first request: its usage and its ``x-glmserve-prefill-start`` header."""
    client = anthropic.Anthropic(base_url=srv.url, api_key="unused")
    seen = []
    for line, question in zip(SESSIONS, QUESTIONS):
        raw = client.messages.with_raw_response.create(
            model=DEFAULT_MODEL, max_tokens=4, system=[{"type": "text", "text": line},
                                                                  {"type": "text", "text": REST}],
            messages=[{"role": "user", "content": question}])
        seen.append((raw.parse().usage.model_dump(), raw.headers["x-glmserve-prefill-start"]))
    return seen


def test_the_report_names_the_attribution_line_when_kept(kept):
    (_, _), (usage, header) = _sessions(kept)
    cached = usage["cache_read_input_tokens"]
    assert cached < 40  # the line's first tokens only: nothing of the rest reused
    assert usage["prefill_start"] == {"token": cached, "message": 0, "role": "system"}
    assert header == f"token={cached}; message=0; role=system"
    assert "in messages[0] (system): 'aad; cc_entrypoint=sdk-cli;" in kept.log()


def test_the_cached_prefix_holds_the_system_prompt_when_the_line_is_removed(server):
    (first, _), (usage, header) = _sessions(server)
    cached = usage["cache_read_input_tokens"]
    assert cached > 300 and cached > first["input_tokens"] - 20  # all but the question and what follows
    assert usage["prefill_start"] == {"token": cached, "message": 1, "role": "user"}
    assert header == f"token={cached}; message=1; role=user"
