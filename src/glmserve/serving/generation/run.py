"""``Run``: one admitted request (one choice of it) and what it has produced so far, shared by
chat and text completions; ``tokens`` (``usage``) of a request's runs."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from glmserve.engine.types import GenerationOutput, GenerationRequest
from glmserve.protocol.chat import PromptTokensDetails, Usage
from glmserve.chat.cache_report import PrefillStart
from glmserve.serving.generation.reply import Tokens, prefill_report
from glmserve.toolcalls import ToolCallParser


@dataclass(slots=True)
class Run:
    """One admitted request and what it has produced so far (chat and text completions)."""

    id: str
    created: int
    request: GenerationRequest
    stops: list[str]
    outputs: AsyncIterator[GenerationOutput] | None
    parser: ToolCallParser | None = None
    forced_prefix: str = ""
    max_calls: int | None = None
    model: str = ""  # the requested model id: the base model or a LoRA adapter
    index: int = 0  # the choice this run answers
    reasoning_budget: int | None = None  # reasoning tokens before the reasoning is ended, when a budget applies
    reasoning_state: str = "answer"  # where the prompt leaves the model (toolcalls.reasoning.prompt_state)
    completion_tokens: int = 0
    engine_prompt_tokens: int = 0  # the prompt size the engine reported (0 until it reports)
    cached_tokens: int = 0
    stop_reason: str | None = None  # the stop string that ended the run, if one did
    arrival: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)  # the template's (chat; the miss report's)
    functions: list[dict[str, Any]] = field(default_factory=list)  # the tools' function objects (chat)
    token_ids: list[int] = field(default_factory=list)  # the tokens generated so far
    prefill_start: PrefillStart | None = None  # where the prompt's prefill started, once the run ended

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens as the engine counted them (vLLM expands image placeholders itself),
        else the prompt's token ids."""
        return self.engine_prompt_tokens or len(self.request.prompt_token_ids)

    @property
    def wants_logprobs(self) -> bool:
        return self.request.sampling.logprobs is not None


def tokens(runs: list[Run], prompts: int = 1) -> Tokens:
    """The token counts of ``runs``, the choices of ``prompts`` prompts (``n`` per prompt, in
    order): each prompt counted once, as OpenAI counts it for ``n``."""
    heads = runs[::len(runs) // prompts]
    return Tokens(sum(r.prompt_tokens for r in heads), sum(r.completion_tokens for r in runs),
                  sum(r.cached_tokens for r in heads), heads[0].prefill_start if prompts == 1 else None)


def chat_usage(counts: Tokens) -> Usage:
    """OpenAI's ``usage`` object of ``counts``."""
    return Usage(prompt_tokens=counts.prompt, completion_tokens=counts.completion,
                 total_tokens=counts.prompt + counts.completion,
                 prompt_tokens_details=PromptTokensDetails(cached_tokens=counts.cached,
                                                           prefill_start=prefill_report(counts.prefill)))


def usage(runs: list[Run], prompts: int = 1) -> Usage:
    """OpenAI's ``usage`` of ``runs`` (``tokens``)."""
    return chat_usage(tokens(runs, prompts))
