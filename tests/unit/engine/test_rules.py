"""The request rules both engines share (``glmserve.engine.rules``)."""

from __future__ import annotations

import pytest

from glmserve.engine.base import EngineError
from glmserve.engine.rules import check_request, finish_reason, stop_token_ids
from glmserve.engine.types import GenerationRequest, ModelInfo, SamplingParams

INFO = ModelInfo(id="m", context_length=10, chat_template="", bos_token="", eos_token="", lora_adapters=("tuned",))


def _request(n_prompt: int, lora: str | None = None) -> GenerationRequest:
    return GenerationRequest("r", list(range(1, n_prompt + 1)), SamplingParams(max_tokens=4), lora=lora)


def test_check_request():
    check_request(_request(9), INFO)
    check_request(_request(3, "tuned"), INFO)
    with pytest.raises(EngineError, match="does not fit the context of 10"):
        check_request(_request(10), INFO)
    with pytest.raises(EngineError, match="unknown LoRA adapter 'other'"):
        check_request(_request(3, "other"), INFO)


def test_stop_token_ids():
    assert stop_token_ids(SamplingParams(max_tokens=1, stop_token_ids=(7,)), frozenset({2})) == {2, 7}
    assert stop_token_ids(SamplingParams(max_tokens=1, stop_token_ids=(7,), ignore_eos=True), frozenset({2})) == set()


@pytest.mark.parametrize(("token", "num_generated", "num_tokens", "expected"), [
    (5, 1, 6, None),
    (2, 1, 6, "stop"),       # a stop token wins over the limits
    (2, 4, 10, "stop"),
    (5, 4, 9, "length"),     # max_tokens reached
    (5, 2, 10, "length"),    # the context is full
])
def test_finish_reason(token, num_generated, num_tokens, expected):
    assert finish_reason(token, frozenset({2}), num_generated, num_tokens, max_tokens=4, context_length=10) == expected
