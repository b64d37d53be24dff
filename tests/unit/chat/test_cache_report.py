"""The miss report (``chat/cache_report.py``): where a prompt's prefill started, logged at debug
for each request (``glmserve.prompt``); it names Claude Code's attribution line when that line
is kept (``--prompt-normalize none``) and the new question when it is removed."""

from __future__ import annotations

import dataclasses
import json
import logging

import pytest
from fastapi.testclient import TestClient

from glmserve.chat import ChatTemplate
from glmserve.chat.cache_report import prefill_start
from glmserve.server import create_app
from glmserve.server.sse import PREFILL_HEADER
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


def _service(normalize: tuple[str, ...] = ("claude-code-attribution",)) -> ChatService:
    return ChatService(ModelPipeline(_CachingEngine(reply="4", context_length=4000), "glm",
                                     ChatTemplate(TEMPLATES["glm45"]), "glm45", prompt_normalize=normalize))


def _reports(normalize: tuple[str, ...], caplog) -> tuple[list[str], list[dict], list[str | None]]:
    """Two Claude Code sessions' first requests: the debug log's reports, the usage's
    ``prefill_start`` and the response header of each."""
    caplog.clear()
    usages, headers = [], []
    with caplog.at_level(logging.DEBUG, "glmserve.prompt"), TestClient(create_app(one_model(_service(normalize)))) as http:
        for line, question in ((SESSION_1, "What is two plus two?"), (SESSION_2, "List the files here.")):
            reply = http.post("/v1/messages", json={"model": "glm", "max_tokens": 4, "system": [
                {"type": "text", "text": line}, {"type": "text", "text": REST}],
                "messages": [{"role": "user", "content": question}]})
            assert reply.is_success
            usages.append(reply.json()["usage"])
            headers.append(reply.headers.get(PREFILL_HEADER))
    return [r.getMessage() for r in caplog.records if "prefill from token" in r.getMessage()], usages, headers


def test_the_report_names_the_attribution_line_when_it_is_kept_and_the_question_when_not(caplog):
    kept, usages, headers = _reports(("none",), caplog)
    assert len(kept) == 2 and "in messages[0] (system): 'aad; cc_entrypoint=sdk-cli;" in kept[1], kept
    cached = usages[1]["cache_read_input_tokens"]
    assert 0 < cached < 60  # the line's first characters only
    assert usages[1]["prefill_start"] == {"token": cached, "message": 0, "role": "system"}
    assert headers[1] == f"token={cached}; message=0; role=system"
    removed, usages, headers = _reports(("claude-code-attribution",), caplog)
    assert len(removed) == 2 and "in messages[1] (user): 'List the files here." in removed[1], removed
    cached = usages[1]["cache_read_input_tokens"]
    assert cached > len(REST) // 2  # the whole system prompt (one character a token here)
    assert usages[1]["prefill_start"] == {"token": cached, "message": 1, "role": "user"}
    assert headers[1] == f"token={cached}; message=1; role=user"


def test_every_api_gives_the_report_in_its_usage_whole_and_streamed():
    """Chat completions (``prompt_tokens_details``), Responses (``input_tokens_details``) and
    Messages (``usage``), whole and in the stream's usage; completions give the token alone."""
    system = {"role": "system", "content": "Be brief. " * 20}
    with TestClient(create_app(one_model(_service()))) as http:
        def chat(question: str, **extra) -> dict:
            body = {"model": "glm", "max_tokens": 2, "messages": [system, {"role": "user", "content": question}]}
            return http.post("/v1/chat/completions", json={**body, **extra})

        chat("First question?")
        whole = chat("Second question?")
        report = whole.json()["usage"]["prompt_tokens_details"]["prefill_start"]
        assert report["message"] == 1 and report["role"] == "user" and report["token"] > 100
        assert whole.headers[PREFILL_HEADER] == f"token={report['token']}; message=1; role=user"
        streamed = chat("A streamed question?", stream=True, stream_options={"include_usage": True})
        assert PREFILL_HEADER not in streamed.headers  # sent before the prompt was read
        last = json.loads([line for line in streamed.text.splitlines() if line.startswith("data: {")][-1][6:])
        assert last["usage"]["prompt_tokens_details"]["prefill_start"]["role"] == "user", last
        response = http.post("/v1/responses", json={"model": "glm", "max_output_tokens": 2,
                                                    "instructions": system["content"], "input": "Third question?"})
        assert response.json()["usage"]["input_tokens_details"]["prefill_start"]["role"] == "user"
        messages = http.post("/v1/messages", json={"model": "glm", "max_tokens": 2, "stream": True,
                                                   "system": system["content"],
                                                   "messages": [{"role": "user", "content": "Fourth?"}]})
        deltas = [json.loads(line[6:]) for line in messages.text.splitlines() if line.startswith("data: ")]
        assert [d["usage"]["prefill_start"]["role"] for d in deltas if d["type"] == "message_delta"] == ["user"]
        completion = http.post("/v1/completions", json={"model": "glm", "prompt": "Be brief. Be brief.",
                                                        "max_tokens": 2}).json()
        assert completion["usage"]["prompt_tokens_details"]["prefill_start"] == {
            "token": completion["usage"]["prompt_tokens_details"]["cached_tokens"]}


def test_the_search_stops_after_messages_the_prompt_does_not_hold():
    """A request of many messages whose texts the prompt does not hold (a template that rewrites
    them, or a hostile request) is not searched message by message to its end: after
    ``MAX_MISSES`` in a row the token is placed after the last message found."""
    from glmserve.chat.cache_report import MAX_MISSES

    unheld = [{"role": "user", "content": f"not in the prompt {i}"} for i in range(MAX_MISSES)]
    messages = [MESSAGES[0], *unheld, *MESSAGES[1:]]
    report = prefill_start(_decode, [ord(c) for c in PROMPT], 81, messages)
    assert (report.message, report.after) == (None, 0)  # the search stopped before "New q"
    shorter = [MESSAGES[0], *unheld[1:], *MESSAGES[1:]]  # one fewer: the search goes on
    report = prefill_start(_decode, [ord(c) for c in PROMPT], 81, shorter)
    assert (report.message, report.roles[report.message]) == (len(shorter) - 1, "user")
