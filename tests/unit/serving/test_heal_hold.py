"""What ``serving/chat/heal.py`` does with a reply's call events before any retry: calls are
held until the reply ends and then sent in the pieces they came in when their arguments pass
the schema; a call past the window is streamed on; where no retry can be placed (a call the
parser could not read shares the reply) a failing call is sent as written and counted. The
retry itself runs on a real engine in ``tests/e2e/test_heal_calls.py``."""

from __future__ import annotations

import asyncio

from glmserve.chat import ChatTemplate
from glmserve.engine.types import GenerationRequest, SamplingParams
from glmserve.serving.chat.heal import WINDOW, CallHealer
from glmserve.serving.generation.pipeline import ModelPipeline
from glmserve.serving.generation.run import Run
from glmserve.toolcalls import DeltaEvent
from tests.unit.fakes import FakeEngine

PARAMETERS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
FUNCTIONS = [{"name": "get_weather", "parameters": PARAMETERS}, {"name": "write_file", "parameters": {
    "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}]


def _healer() -> tuple[CallHealer, ModelPipeline]:
    pipeline = ModelPipeline(FakeEngine(grammar=True), "glm", ChatTemplate("{{ messages }}"), "glm47")
    request = GenerationRequest("chatcmpl-1", [1, 2, 3], SamplingParams(max_tokens=100))
    return CallHealer(pipeline, Run("chatcmpl-1", 0, request, [], None, model="glm", functions=FUNCTIONS), 7), pipeline


def test_calls_are_held_until_the_end_and_sent_in_their_pieces_when_they_pass():
    healer, _ = _healer()
    pieces = [DeltaEvent("tool_call", index=0, name="get_weather"), DeltaEvent("tool_call", index=0, arguments='{"ci'),
              DeltaEvent("tool_call", index=0, arguments='ty": "Bonn"}')]
    text = DeltaEvent("content", "Checking.")
    assert healer.feed([text, pieces[0]]) == [text]  # text goes out, the call waits
    assert healer.feed(pieces[1:]) == []
    assert asyncio.run(healer.finish(0)) == pieces


def test_a_long_call_is_streamed_on_and_a_failing_call_without_a_retry_goes_out_as_written():
    healer, pipeline = _healer()
    long = [DeltaEvent("tool_call", index=0, name="write_file"),
            DeltaEvent("tool_call", index=0, arguments='{"text": "' + "x" * WINDOW)]
    assert healer.feed(long) == long  # past the window: released
    more = DeltaEvent("tool_call", index=0, arguments='"}')
    assert healer.feed([more]) == [more]
    broken = [DeltaEvent("tool_call", index=1, name="get_weather", arguments="{}")]
    assert healer.feed(broken) == []
    assert asyncio.run(healer.finish(1)) == broken  # a call the parser could not read: no retry
    assert 'glmserve:calls_healed_total{model_name="glm",result="failed"} 1.0' in pipeline.metrics.render().decode()


def test_a_client_s_regular_expression_is_not_run_by_the_check():
    """A client's ``pattern`` (``^(a+)+$`` backtracks for hours on 40 a's and a "!") is left to
    the retry's grammar: the check passes a value the pattern refuses, and checks the rest."""
    from glmserve.serving.chat.heal import _valid

    evil = {"name": "f", "parameters": {"type": "object", "properties": {
        "s": {"type": "string", "pattern": "^(a+)+$"}, "pattern": {"type": "integer"}}, "required": ["s"]}}
    assert _valid(evil, '{"s": "' + "a" * 40 + '!"}')
    assert not _valid(evil, "{}") and not _valid(evil, '{"s": 3}')
    assert not _valid(evil, '{"s": "a", "pattern": "x"}')  # a property named pattern is still checked
