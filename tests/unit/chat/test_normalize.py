"""``--prompt-normalize`` (``chat/normalize.py``): Claude Code's attribution line is removed from
the first system message before the prompt is rendered, in every API, so two sessions' prompts
share their system-and-tools prefix; nothing else is touched, and ``none`` keeps it."""

from __future__ import annotations

import logging

import pytest
from fastapi.testclient import TestClient

from glmserve.chat import ChatTemplate
from glmserve.chat.normalize import PromptNormalizer
from glmserve.server import create_app
from glmserve.serving.chat.service import ChatService
from glmserve.serving.generation.pipeline import ModelPipeline
from tests.unit.fakes import FakeEngine, one_model
from tests.unit.serving.test_serving_tools import TEMPLATES

# the first system block of two `claude -p` sessions of Claude Code 2.1.330 (captured here,
# 2026-12-04, with a local endpoint standing in for the API), and a sub-agent's form
SESSION_1 = "x-anthropic-billing-header: cc_version=2.1.330.0d5; cc_entrypoint=sdk-cli;"
SESSION_2 = "x-anthropic-billing-header: cc_version=2.1.330.aad; cc_entrypoint=sdk-cli;"
SUB_AGENT = "x-anthropic-billing-header: cc_version=2.1.197.73f; cc_entrypoint=cli; cc_is_subagent=true; cch=1a2b3;"
REST = "You are a Claude agent, built on Anthropic's Claude Agent SDK."


@pytest.mark.parametrize("line", [SESSION_1, SESSION_2, SUB_AGENT])
def test_the_attribution_line_is_removed_from_the_first_system_message(line, caplog):
    normalize = PromptNormalizer()
    user = {"role": "user", "content": "What is two plus two?"}
    with caplog.at_level(logging.DEBUG, "glmserve.prompt"):
        assert normalize([{"role": "system", "content": f"{line}\n{REST}"}, user]) == [
            {"role": "system", "content": REST}, user]
    assert f"removed {line + chr(10)!r}" in caplog.text
    parts = [{"type": "text", "text": line}, {"type": "text", "text": REST}]
    assert normalize([{"role": "system", "content": parts}, user]) == [
        {"role": "system", "content": [{"type": "text", "text": REST}]}, user]
    assert normalize([{"role": "system", "content": line}, user]) == [user]  # left empty: dropped


@pytest.mark.parametrize("messages", [
    [{"role": "user", "content": f"{SESSION_1}\n{REST}"}],  # not a system message
    [{"role": "system", "content": REST}, {"role": "system", "content": SESSION_1}],  # not the first
    [{"role": "system", "content": f"{REST}\n{SESSION_1}"}],  # not its first line
    [{"role": "system", "content": "x-anthropic-billing-header: this is what the user wrote"}],  # not its fields
    [{"role": "system", "content": "x-anthropic-billing-header: cc_version=2.1.330.0d5; cc_entrypoint=cli; and more"}],
])
def test_nothing_else_is_touched(messages):
    assert PromptNormalizer()(messages) == messages


def test_none_keeps_it_and_unknown_rules_are_refused():
    messages = [{"role": "system", "content": f"{SESSION_1}\n{REST}"}]
    assert PromptNormalizer(["none"])(messages) == messages
    with pytest.raises(ValueError, match="bogus"):
        PromptNormalizer(["bogus"])
    with pytest.raises(ValueError, match="none alone"):
        PromptNormalizer(["none", "claude-code-attribution"])


def _prompts(normalize: tuple[str, ...]) -> list[str]:
    """The prompts two sessions' first requests render to, through chat completions (a proxy
    such as claude-code-router) and the Messages API (Claude Code itself)."""
    engine = FakeEngine(reply="4")
    service = ChatService(ModelPipeline(engine, "glm", ChatTemplate(TEMPLATES["glm45"]), "glm45",
                                        prompt_normalize=normalize))
    with TestClient(create_app(one_model(service))) as http:
        for line, question in ((SESSION_1, "What is two plus two?"), (SESSION_2, "List the files here.")):
            assert http.post("/v1/chat/completions", json={"model": "glm", "max_tokens": 4, "messages": [
                {"role": "system", "content": f"{line}\n{REST}"}, {"role": "user", "content": question}]}).is_success
            assert http.post("/v1/messages", json={"model": "glm", "max_tokens": 4, "system": [
                {"type": "text", "text": line}, {"type": "text", "text": REST}],
                "messages": [{"role": "user", "content": question}]}).is_success
    return [engine.prompt_text(request) for request in engine.requests]


def test_two_sessions_prompts_share_everything_before_the_question_in_both_apis():
    chat_1, messages_1, chat_2, messages_2 = _prompts(("claude-code-attribution",))
    for first, second in ((chat_1, chat_2), (messages_1, messages_2)):
        assert "billing" not in first + second and REST in first
        shared = first[:first.index("What is two")]
        assert second.startswith(shared)
    kept = _prompts(("none",))
    assert all(SESSION_1 in p or SESSION_2 in p for p in kept)  # off: the line is the model's to read
