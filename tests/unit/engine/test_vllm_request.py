"""``engine/vllm/request.py``: what reaches vLLM's ``AsyncLLM.generate`` for a request, read by
a recording stand-in for it: the request's priority (batch lines behind interactive requests
under ``--scheduling-policy priority``), its LoRA adapter and its id. The scheduling itself is
vLLM's; the e2e test (tests/e2e/test_vllm_engine.py) runs a batch beside interactive requests."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("vllm")

from glmserve.engine.types import BATCH_PRIORITY, GenerationRequest, SamplingParams  # noqa: E402


class RecordingLLM:
    """``AsyncLLM.generate``'s call recorded; one output that ends the request."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def generate(self, prompt, params, request_id, lora_request=None, priority=0, **kwargs):
        self.calls.append({"request_id": request_id, "priority": priority, "lora_request": lora_request})

        async def outputs():
            from types import SimpleNamespace

            yield SimpleNamespace(prompt_token_ids=prompt["prompt_token_ids"], num_cached_tokens=0, outputs=[
                SimpleNamespace(token_ids=[7], finish_reason="length", logprobs=None)])
        return outputs()


class Detokenizer:
    def feed(self, token: int) -> str:
        return f"<{token}>"

    def flush(self) -> str:
        return ""


class Tokenizer:
    def detokenizer(self, prompt_tail, shown=frozenset(), escaped=frozenset()):
        return Detokenizer()


@pytest.mark.parametrize("priority", [0, BATCH_PRIORITY])
def test_the_request_priority_reaches_vllm(priority):
    from vllm import SamplingParams as VllmSamplingParams

    from glmserve.engine.vllm.request import _outputs

    llm, released = RecordingLLM(), []
    request = GenerationRequest("req-1", [1, 2, 3], SamplingParams(max_tokens=1), priority=priority)

    async def read():
        return [out async for out in _outputs(llm, Tokenizer(), request, VllmSamplingParams(max_tokens=1), None,
                                              lambda: released.append(True))]

    outputs = asyncio.run(read())
    assert llm.calls == [{"request_id": "req-1", "priority": priority, "lora_request": None}]
    assert [(o.text, o.finish_reason) for o in outputs] == [("<7>", "length")]
    assert released == [True]
