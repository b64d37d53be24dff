"""OpenAI request options -> engine ``SamplingParams``, refusing what cannot be honoured.

Nothing is silently ignored: a parameter the server cannot honour yet is a 400 naming it.
"""

from __future__ import annotations

from dataclasses import replace

from glmserve.engine.types import SamplingParams
from glmserve.protocol.chat import ChatCompletionRequest
from glmserve.protocol.errors import invalid_request



def with_defaults(req, defaults: dict[str, float]):
    """``(req, ceiling)``: ``req`` (a chat or completions request) with ``defaults`` for the
    sampling fields it did not set (``--override-generation-config``, as vLLM applies a model's
    generation config). ``max_new_tokens`` becomes the ``max_tokens`` of a request that sets
    none (neither ``max_tokens`` nor ``max_completion_tokens``); ``ceiling`` is then True: as in
    vLLM, it is lowered to what the prompt leaves of the context rather than refused."""
    missing = {k: v for k, v in defaults.items() if k in type(req).model_fields and k not in req.model_fields_set}
    ceiling = False
    if "max_new_tokens" in defaults and getattr(req, "max_completion_tokens", None) is None \
            and ("max_tokens" not in req.model_fields_set or req.max_tokens is None):
        missing["max_tokens"], ceiling = int(defaults["max_new_tokens"]), True
    return (req.model_copy(update=missing) if missing else req), ceiling


def check_n(n: int, max_n: int) -> None:
    """Raise a 400 ``APIError`` when ``n`` is over ``max_n`` (``--max-n``)."""
    if n > max_n:
        raise invalid_request(f"n may be at most {max_n} on this server (--max-n)", "n")


def choice_sampling(sampling: SamplingParams, i: int) -> SamplingParams:
    """The sampling of choice ``i`` of ``n``: with a ``seed``, ``seed + i``, so that the choices
    differ and each is reproducible; otherwise the same parameters (a fresh random seed each)."""
    if i == 0 or sampling.seed is None:
        return sampling
    return replace(sampling, seed=(sampling.seed + i) & 0xFFFFFFFFFFFFFFFF)


def check_supported(req: ChatCompletionRequest) -> None:
    """Raise a 400 ``APIError`` for options this server does not implement."""
    if req.top_logprobs is not None and not req.logprobs:
        raise invalid_request("top_logprobs needs logprobs: true", "top_logprobs")


MAX_LOGIT_BIAS = 1024  # entries: each one is applied at every step


def logit_bias(req: ChatCompletionRequest, n_vocab: int) -> dict[int, float] | None:
    """``req.logit_bias`` with token ids as ints. Raises a 400 naming the ids that are not
    token ids of this model (``0 .. n_vocab - 1``), for values outside -100..100, or for more
    than ``MAX_LOGIT_BIAS`` entries."""
    if not req.logit_bias:
        return None
    if len(req.logit_bias) > MAX_LOGIT_BIAS:
        raise invalid_request(f"logit_bias may hold at most {MAX_LOGIT_BIAS} tokens", "logit_bias")
    bias, bad = {}, []
    for key, value in req.logit_bias.items():
        token = int(key) if key.strip().lstrip("-").isdigit() else None
        if token is None or not 0 <= token < n_vocab:
            bad.append(key)
        elif not -100 <= value <= 100:
            raise invalid_request(f"logit_bias values must be between -100 and 100 (token {key}: {value})",
                                  "logit_bias")
        else:
            bias[token] = float(value)
    if bad:
        shown = ", ".join(repr(k) for k in bad[:10]) + (f" and {len(bad) - 10} more" if len(bad) > 10 else "")
        raise invalid_request(f"logit_bias keys must be token ids of this model (0 to {n_vocab - 1}): {shown}",
                              "logit_bias")
    return bias


def requested_max_tokens(req: ChatCompletionRequest) -> int | None:
    """``max_completion_tokens`` (current OpenAI name) or the legacy ``max_tokens``."""
    return req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens


def stop_strings(req: ChatCompletionRequest) -> list[str]:
    if req.stop is None:
        return []
    return [req.stop] if isinstance(req.stop, str) else list(req.stop)


def to_sampling_params(
    req: ChatCompletionRequest, max_tokens: int, stop_token_ids: tuple[int, ...], grammar: str | None = None,
    bias: dict[int, float] | None = None,
) -> SamplingParams:
    """Engine sampling parameters for ``req``; ``max_tokens`` is already resolved and fits;
    ``bias``: ``req.logit_bias`` checked by ``logit_bias``."""
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
        logit_bias=bias,
        logprobs=requested_logprobs(req),
    )


def requested_logprobs(req: ChatCompletionRequest) -> int | None:
    """How many alternatives per token the request wants (None: no logprobs). Chat:
    ``logprobs: true`` and ``top_logprobs``; completions: ``logprobs`` as that number."""
    if isinstance(req.logprobs, bool) or req.logprobs is None:
        return (req.top_logprobs or 0) if req.logprobs else None
    return req.logprobs
