"""Loop rescue on a real engine: a tiny GLM trained here on GLM-4.7's template to reason in a
loop ("Wait, let me check the file again." with no end of its own, the way GLM models are seen
to loop until ``max_tokens``), served by the transformers engine with the default
``--loop-guard``. The loop guard ends the reasoning once the loop has filled its span, and the
model, given ``</think>``, answers: the client gets the reasoning up to there, the answer, and
``stop``, where without the guard it would get the loop until ``max_tokens`` and no answer."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.conftest import RemoteServer

UNIT, ANSWER = " Wait, let me check the file again.", "The file is fine."
ASK = [{"role": "user", "content": "Is the file fine?"}]
MODEL = "tiny-glm47-looper"


@pytest.fixture(scope="module")
def looper(tmp_path_factory):
    pytest.importorskip("torch")
    from glmserve.engine.loops import MIN_SPAN
    from tests.hf_models import tiny_glm_looper

    folder = tiny_glm_looper(tmp_path_factory.mktemp("looper") / MODEL, ASK, UNIT, ANSWER, MIN_SPAN + 64,
                             cuts=(MIN_SPAN,))
    srv = RemoteServer("--engine", "transformers", "--model", str(folder), "--served-model-name", MODEL)
    yield srv
    srv.stop()


def test_a_looping_reasoning_is_ended_and_the_model_answers(looper):
    client = openai.OpenAI(base_url=f"{looper.url}/v1", api_key="unused", max_retries=0, timeout=600)
    reply = client.chat.completions.create(model=MODEL, messages=ASK, temperature=0, max_tokens=900)
    choice = reply.choices[0]
    reasoning = choice.message.model_extra["reasoning_content"]
    assert reasoning.startswith(UNIT.strip()) and reasoning.count("check the file again") >= 4
    assert (choice.message.content, choice.finish_reason) == (ANSWER, "stop")
    assert reply.usage.completion_tokens < 400  # the loop's span, the marker and the answer; not max_tokens
    metrics = httpx.get(f"{looper.url}/metrics").text
    assert f'glmserve:loops_stopped_total{{model_name="{MODEL}",where="reasoning"}} 1.0' in metrics
    streamed = client.chat.completions.create(model=MODEL, messages=ASK, temperature=0, max_tokens=900, stream=True)
    chunks = [c.choices[0] for c in streamed if c.choices]
    assert "".join(c.delta.content or "" for c in chunks) == ANSWER
    assert "".join(c.delta.model_extra.get("reasoning_content") or "" for c in chunks) == reasoning
    assert chunks[-1].finish_reason == "stop"
