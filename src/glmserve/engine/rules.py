"""Request rules every engine applies, kept once: whether an engine takes a request, which
tokens end it, and when a generated token ends it."""

from __future__ import annotations

from glmserve.engine.base import EngineError
from glmserve.engine.types import FinishReason, GenerationRequest, ModelInfo, SamplingParams


def check_request(request: GenerationRequest, info: ModelInfo) -> None:
    """Raise ``EngineError`` when the prompt leaves no room to generate in
    ``info.context_length`` tokens, or when ``request.lora`` names no loaded adapter."""
    n_prompt = len(request.prompt_token_ids)
    if n_prompt >= info.context_length:
        raise EngineError(f"prompt of {n_prompt} tokens does not fit the context of {info.context_length}")
    if request.lora is not None and request.lora not in info.lora_adapters:
        raise EngineError(f"unknown LoRA adapter {request.lora!r}")


def stop_token_ids(sampling: SamplingParams, eog_ids: frozenset[int]) -> frozenset[int]:
    """Token ids that end generation: the model's end-of-generation ids plus the request's
    ``stop_token_ids``, or none with ``ignore_eos``."""
    return frozenset() if sampling.ignore_eos else eog_ids | frozenset(sampling.stop_token_ids)


def finish_reason(token: int, stop_ids: frozenset[int], num_generated: int, num_tokens: int,
                  max_tokens: int, context_length: int) -> FinishReason | None:
    """Why generation ends at ``token`` (the ``num_generated``-th generated token; the sequence
    now holds ``num_tokens`` tokens, prompt included): "stop" for a stop token, "length" at
    ``max_tokens`` or a full context, else None."""
    if token in stop_ids:
        return "stop"
    if num_generated >= max_tokens or num_tokens >= context_length:
        return "length"
    return None
