"""The miss report (``chat/cache_report.py``): where a prompt's prefill started, logged at debug
for each request (``glmserve.prompt``); it names Claude Code's attribution line when that line
is kept (``--prompt-normalize none``) and the new question when it is removed."""

from __future__ import annotations

import dataclasses
import logging

import pytest
from fastapi.testclient import TestClient

from glmserve.chat import ChatTemplate
from glmserve.chat.cache_report import prefill_start
from glmserve.server import create_app
from glmserve.serving.chat.service import ChatService
from glmserve.serving.generation.pipeline import ModelPipeline
from tests.unit.chat.test_normalize import REST, SESSION_1, SESSION_2
from tests.unit.fakes import FakeEngine, one_model
from tests.unit.serving.test_serving_tools import TEMPLATES


def _decode(ids: list[int]) -> str:
    return "".join(map(chr, ids))


PROMPT = "<|system|>\nBe brief.<tools>x</tools><|user|>\nHello there<|assistant|>\nHi<|user|>\nNew q"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"},
            {"role": "assistant", "content": "Hi"}, {"role": "user", "content": [{"type": "text", "text": "New q"}]}]


@pytest.mark.parametrize(("cached", "where", "text"), [
    (0, "before messages[0]", "<|system|>"),
    (13, "in messages[0] (system)", " brief."),
    (22, "after messages[0] (system)", "ools>x</tools>"),  # the tools the template wrote after it
    (51, "in messages[1] (user)", "there<|assistant|>"),
    (75, "after messages[2] (assistant)", "ser|>\nNew q"),
    (81, "in messages[3] (user)", "New q"),
])
def test_the_first_computed_token_is_placed_in_its_message(cached, where, text):
    report = prefill_start(_decode, [ord(c) for c in PROMPT], cached, MESSAGES)
    assert str(report).startswith(f"prefill from token {cached} of {len(PROMPT)} {where}: {text!r}"[:-1])
    assert report.token == cached and PROMPT[cached:].startswith(report.text)


def test_without_messages_or_with_all_cached():
    assert str(prefill_start(_decode, [ord(c) for c in "abc"], 1)) == "prefill from token 1 of 3: 'bc'"
    assert prefill_start(_decode, [ord(c) for c in PROMPT], 10**6, MESSAGES).text == ""


class _CachingEngine(FakeEngine):
    """Reports the longest prefix its prompt shares with an earlier one as read from the cache."""

    async def _outputs(self, request, prompt, n):
        ids = request.prompt_token_ids
        shared = [next((i for i, (a, b) in enumerate(zip(e.prompt_token_ids, ids)) if a != b),
                       min(len(ids), len(e.prompt_token_ids))) for e in self.requests[:-1]]
        async for out in super()._outputs(request, prompt, n):
            yield dataclasses.replace(out, num_cached_tokens=min(max(shared, default=0), n - 1))


def _reports(normalize: tuple[str, ...], caplog) -> list[str]:
    service = ChatService(ModelPipeline(_CachingEngine(reply="4", context_length=4000), "glm",
                                        ChatTemplate(TEMPLATES["glm45"]), "glm45", prompt_normalize=normalize))
    caplog.clear()
    with caplog.at_level(logging.DEBUG, "glmserve.prompt"), TestClient(create_app(one_model(service))) as http:
        for line, question in ((SESSION_1, "What is two plus two?"), (SESSION_2, "List the files here.")):
            assert http.post("/v1/messages", json={"model": "glm", "max_tokens": 4, "system": [
                {"type": "text", "text": line}, {"type": "text", "text": REST}],
                "messages": [{"role": "user", "content": question}]}).is_success
    return [r.getMessage() for r in caplog.records if "prefill from token" in r.getMessage()]


def test_the_report_names_the_attribution_line_when_it_is_kept_and_the_question_when_not(caplog):
    kept = _reports(("none",), caplog)
    assert len(kept) == 2 and "in messages[0] (system): 'aad; cc_entrypoint=sdk-cli;" in kept[1], kept
    removed = _reports(("claude-code-attribution",), caplog)
    assert len(removed) == 2 and "in messages[1] (user): 'List the files here." in removed[1], removed
