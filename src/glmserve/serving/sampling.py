"""OpenAI request options -> engine ``SamplingParams``, refusing what cannot be honoured.

Nothing is silently ignored: a parameter the server cannot honour yet is a 400 naming it.
"""

from __future__ import annotations

from glmserve.engine.types import SamplingParams
from glmserve.protocol.chat import ChatCompletionRequest
from glmserve.protocol.errors import invalid_request


def check_supported(req: ChatCompletionRequest) -> None:
    """Raise a 400 ``APIError`` for options this server does not implement."""
    if req.n != 1:
        raise invalid_request("only n=1 is supported", "n", "unsupported_parameter")
    if req.logprobs or req.top_logprobs:
        raise invalid_request("logprobs are not supported yet", "logprobs", "unsupported_parameter")
    if req.logit_bias:
        raise invalid_request("logit_bias is not supported yet", "logit_bias", "unsupported_parameter")


def requested_max_tokens(req: ChatCompletionRequest) -> int | None:
    """``max_completion_tokens`` (current OpenAI name) or the legacy ``max_tokens``."""
    return req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens


def stop_strings(req: ChatCompletionRequest) -> list[str]:
    if req.stop is None:
        return []
    return [req.stop] if isinstance(req.stop, str) else list(req.stop)


def to_sampling_params(
    req: ChatCompletionRequest, max_tokens: int, stop_token_ids: tuple[int, ...], grammar: str | None = None
) -> SamplingParams:
    """Engine sampling parameters for ``req``; ``max_tokens`` is already resolved and fits."""
    temperature = 1.0 if req.temperature is None else req.temperature
    top_p = 1.0 if req.top_p is None else req.top_p
    if top_p == 0.0:  # "consider only the most likely token": greedy
        temperature, top_p = 0.0, 1.0
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=req.top_k if req.top_k is not None and req.top_k > 0 else 0,
        min_p=req.min_p or 0.0,
        presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty,
        repetition_penalty=req.repetition_penalty or 1.0,
        seed=req.seed,
        ignore_eos=req.ignore_eos,
        stop_token_ids=stop_token_ids,
        grammar=grammar,
    )
