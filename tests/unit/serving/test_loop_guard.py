"""The loop guard over the real app, chat template and parsers, with the scripted fake engine
(one token per character): a loop in the reasoning ends the reasoning and the answer follows;
a loop in the answer stops the reply with ``length`` (Anthropic ``max_tokens``); each is logged
and counted; ``--loop-guard off`` and, by default, models without reasoning leave replies alone.
The tiny trained GLM in ``tests/e2e/test_loop_guard.py`` does the same on a real engine."""

from __future__ import annotations

import logging

from fastapi.testclient import TestClient

from glmserve.chat import ChatTemplate
from glmserve.engine.loops import MIN_SPAN
from glmserve.engine.types import GenerationOutput
from glmserve.server import create_app
from glmserve.serving.generation.pipeline import ModelPipeline
from tests.unit.fakes import FakeEngine, one_model
from tests.unit.serving.test_messages_mapping import _events as message_events
from tests.unit.serving.test_reasoning_routes import ANSWER, ASK, GLM47, _thinker
from tests.unit.serving.test_serving_tools import _stream as chat_stream

STUCK = "Wait, let me check the file again. " * 40  # 35 characters a period: a loop
CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


class _Merged(FakeEngine):
    """Hands over ``group`` tokens an output, as ``--stream-interval-ms`` merges a step's outputs."""

    group = 7

    async def _outputs(self, request, prompt, n):
        parts: list[GenerationOutput] = []
        async for out in super()._outputs(request, prompt, n):
            parts.append(out)
            if len(parts) == self.group or out.finished:
                yield GenerationOutput(out.request_id, [t for p in parts for t in p.token_ids],
                                       "".join(p.text for p in parts), out.finish_reason, num_prompt_tokens=n)
                parts = []


def _client(reply, template: str = GLM47, parser: str | None = "glm47", loop_guard: str = "reasoning",
            engine_type: type[FakeEngine] = FakeEngine):
    engine = engine_type(reply=reply, context_length=8000)
    pipeline = ModelPipeline(engine, "glm", ChatTemplate(template), parser, loop_guard=loop_guard)
    return engine, pipeline, TestClient(create_app(one_model(pipeline)))


def test_a_loop_in_the_reasoning_ends_it_and_the_answer_follows(caplog):
    engine, pipeline, client = _client(_thinker(STUCK))
    body = {"model": "glm", "messages": ASK, "max_tokens": 4000}
    with caplog.at_level(logging.WARNING, logger="glmserve.loop_guard"):
        reply = client.post("/v1/chat/completions", json=body).json()
    message = reply["choices"][0]
    assert message["message"]["reasoning_content"] == STUCK[:MIN_SPAN]  # caught at its span
    assert (message["message"]["content"], message["finish_reason"]) == (ANSWER, "stop")
    assert engine.requests[1].prompt_token_ids[-len("</think>"):] == [ord(c) for c in "</think>"]
    assert engine.requests[0].request_id in engine.aborted
    assert "a period of 35 tokens" in caplog.text and "the reasoning is ended" in caplog.text
    content, reasoning, _, finish = chat_stream(client, body)
    assert (reasoning, content, finish) == (STUCK[:MIN_SPAN], ANSWER, "stop")
    assert 'glmserve:loops_stopped_total{model_name="glm",where="reasoning"} 2.0' in client.get("/metrics").text


def test_outputs_of_several_tokens_are_cut_where_the_loop_was_found():
    # the loop's last token falls inside a merged output: the reasoning ends there, not at the
    # output's end, so a reply is the same whatever the grouping
    assert MIN_SPAN % _Merged.group
    for looping, answer in ((_thinker(STUCK), ANSWER), ("Done.</think>" + "ha" * 300, "ha" * (MIN_SPAN // 2))):
        engine, _, client = _client(looping, engine_type=_Merged)
        message = client.post("/v1/chat/completions", json={"model": "glm", "messages": ASK,
                                                              "max_tokens": 4000}).json()["choices"][0]["message"]
        assert message["reasoning_content"] == (STUCK[:MIN_SPAN] if answer == ANSWER else "Done.")
        assert message["content"] == answer


def test_a_loop_in_the_answer_stops_it_as_max_tokens_would(caplog):
    looping = "Done.</think>" + "ha" * 300
    engine, pipeline, client = _client(looping)
    with caplog.at_level(logging.WARNING, logger="glmserve.loop_guard"):
        reply = client.post("/v1/chat/completions", json={"model": "glm", "messages": ASK}).json()
    choice = reply["choices"][0]
    assert choice["message"]["reasoning_content"] == "Done." and choice["finish_reason"] == "length"
    assert choice["message"]["content"] == "ha" * (MIN_SPAN // 2)
    assert reply["usage"]["completion_tokens"] == len("Done.</think>") + MIN_SPAN
    assert engine.requests[0].request_id in engine.aborted and len(engine.requests) == 1
    assert "stopped (finish_reason length)" in caplog.text
    events = message_events(client, {"model": "glm", "max_tokens": 4000, "messages": ASK})
    assert events[-2][1]["delta"]["stop_reason"] == "max_tokens"
    assert 'loops_stopped_total{model_name="glm",where="answer"} 2.0' in client.get("/metrics").text


def test_off_and_models_without_reasoning_leave_loops_alone_and_all_guards_them():
    _, _, off = _client(_thinker(STUCK), loop_guard="off")
    reply = off.post("/v1/chat/completions", json={"model": "glm", "messages": ASK}).json()["choices"][0]
    assert reply["message"]["reasoning_content"] == STUCK.rstrip() and not reply["message"]["content"]
    for guard, content, finish in (("reasoning", STUCK, "stop"), ("all", STUCK[:MIN_SPAN], "length")):
        _, _, client = _client(STUCK, CHATML, None, loop_guard=guard)
        reply = client.post("/v1/chat/completions", json={"model": "glm", "messages": ASK}).json()["choices"][0]
        assert (reply["message"]["content"], reply["finish_reason"]) == (content, finish), guard
    exact = client.post("/v1/chat/completions", json={"model": "glm", "messages": ASK, "ignore_eos": True,
                                                      "max_tokens": len(STUCK)}).json()["choices"][0]
    assert exact["message"]["content"] == STUCK  # ignore_eos: max_tokens tokens, whatever they are
