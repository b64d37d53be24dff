"""``ModelSettings``: the settings of one served model: ``EngineSettings`` and every engine's
settings class (``LlamaCppSettings``, ``TransformersSettings``, ``VllmSettings``; a field of an
engine other than ``engine`` is refused at start-up, ``engine.check_engine_settings``), how its
prompts are answered (``AnswerSettings``) and what one request may cost (``RequestLimits``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, field_validator

from glmserve.chat.normalize import NONE as NORMALIZE_NONE
from glmserve.chat.normalize import RULES as NORMALIZE_RULES
from glmserve.chat.normalize import PromptNormalizer
from glmserve.chat.template import RESERVED_TEMPLATE_VARIABLES
from glmserve.engine.llama_cpp.settings import LlamaCppSettings
from glmserve.engine.settings import PER_MODEL
from glmserve.engine.transformers.settings import TransformersSettings
from glmserve.engine.vllm.settings import VllmSettings
from glmserve.protocol.chat import ChatCompletionRequest
from glmserve.toolcalls import PARSERS

# the request fields --override-generation-config may give defaults for (vLLM's flag), and
# vLLM's max_new_tokens: the max_tokens of a request that sets none
GENERATION_DEFAULTS = frozenset({"temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
                                 "frequency_penalty", "max_new_tokens"})


# --tool-call-parser's choices: the registered formats (serving/generation/tool_formats.py, whose
# parsers toolcalls.PARSERS names), auto (from the chat template) and none
TOOL_CALL_PARSERS = ("auto", "none", *PARSERS)
# --prompt-normalize's choices: the rules (chat/normalize.py) and none
PROMPT_NORMALIZE = (*NORMALIZE_RULES, NORMALIZE_NONE)


class AnswerSettings(BaseModel):
    """How prompts are rendered and answered."""

    served_model_name: str | None = Field(
        None, description="Model id that clients send as model.", json_schema_extra=PER_MODEL,
    )
    offline: bool = Field(
        False, description="Never reach the Hugging Face Hub: a --model by name must be in its cache (as "
                           "HF_HUB_OFFLINE=1).",
    )
    revision: str | None = Field(
        None, description="The branch, tag or commit of a --model by name (ORG/NAME@REV says it too).",
        json_schema_extra=PER_MODEL,
    )
    chat_template: str | None = Field(
        None, description="A Jinja2 chat template file to use instead of the model's own.",
        json_schema_extra=PER_MODEL,
    )
    default_chat_template_kwargs: dict[str, Any] = Field(
        {}, description='Chat template variables for requests that do not set them, e.g. \'{"enable_thinking": '
                        "false}'.",
        json_schema_extra=PER_MODEL,
    )
    override_generation_config: dict[str, float] = Field(
        {}, description='Sampling defaults for requests that leave them out (vLLM\'s flag), e.g. \'{"temperature": '
                        '0.6, "max_new_tokens": 4096}\'.',
        json_schema_extra=PER_MODEL,
    )
    reasoning_budget: int = Field(
        -1, ge=-1, description="Reasoning tokens before glmserve ends the reasoning, for requests that set no "
                               "budget (-1: no limit; 0: no reasoning).", json_schema_extra=PER_MODEL)
    loop_guard: Literal["off", "reasoning", "all"] = Field(
        "reasoning", description="A reply that loops (tokens repeated): its reasoning is ended, its answer stopped; "
        "reasoning: on reasoning models; all: any.", json_schema_extra=PER_MODEL)
    heal_calls: Literal["on", "off"] = Field(
        "on", description="A tool call whose arguments fail its schema is decoded once more under that tool's grammar.",
        json_schema_extra=PER_MODEL)
    prompt_normalize: list[Literal[PROMPT_NORMALIZE]] = Field(
        list(NORMALIZE_RULES), description="Per-session lines removed from prompts so prefix caches serve new sessions "
        "(repeatable; none: keep all).", json_schema_extra=PER_MODEL,
    )
    tool_call_parser: Literal[TOOL_CALL_PARSERS] = Field(
        "auto", description="Tool-call format; auto: from the chat template (generic when it has none); none: no "
                            "tool calling.", json_schema_extra=PER_MODEL,
    )

    @field_validator("prompt_normalize")
    @classmethod
    def _check_prompt_normalize(cls, value: list[str]) -> list[str]:
        PromptNormalizer(value)  # none alone, or rules
        return value

    @field_validator("default_chat_template_kwargs")
    @classmethod
    def _check_template_kwargs(cls, value: dict[str, Any]) -> dict[str, Any]:
        taken = sorted(set(value) & RESERVED_TEMPLATE_VARIABLES)
        if taken:
            raise ValueError(f"{', '.join(taken)}: set by the server, not a chat template keyword")
        return value

    @field_validator("override_generation_config")
    @classmethod
    def _check_generation_config(cls, value: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(value) - GENERATION_DEFAULTS)
        if unknown:
            raise ValueError(f"{', '.join(unknown)}: not a sampling field (one of "
                             f"{', '.join(sorted(GENERATION_DEFAULTS))})")
        max_new = value.get("max_new_tokens")
        if max_new is not None and (max_new != int(max_new) or max_new < 1):
            raise ValueError("max_new_tokens: a whole number of tokens, at least 1")
        try:  # within the bounds a request's own values have
            ChatCompletionRequest.model_validate({"model": "-", "messages": [{"role": "user", "content": "-"}], **value},
                                                 strict=False)  # JSON numbers here are floats: top_k 40.0
        except ValidationError as exc:
            raise ValueError("; ".join(f"{e['loc'][0]}: {e['msg']}" for e in exc.errors())) from None
        return value


class RequestLimits(BaseModel):
    """Bounds on what one request may cost."""

    max_n: int = Field(
        8, ge=1, le=128,
        description="Largest n (choices per request) a request may ask for; each choice is one sequence.",
    )
    max_embedding_inputs: int = Field(
        2048, ge=1, le=1 << 20, description="Most inputs one /v1/embeddings request may hold (OpenAI's limit is "
                                            "2048).",
    )
    max_embedding_tokens: int = Field(
        32768, ge=1, le=1 << 30,
        description="Most tokens one /v1/embeddings request may hold, all inputs together (each input also fits "
                    "--n-ctx).",
    )
    max_schema_depth: int = Field(
        32, ge=2, le=256, description="Deepest nesting of a client JSON schema (response_format, tool parameters)."
    )
    max_schema_nodes: int = Field(
        10_000, ge=10, le=1_000_000, description="Most values (objects, arrays, scalars) in one client JSON "
                                                 "schema."
    )
    max_schema_repeat: int = Field(
        1000, ge=1, le=10_000,
        description="Largest repetition bound a constrained schema may set (minLength, maxItems, {m,n}, ...): each "
                    "is spelled out in the grammar.",
    )
    max_grammar_bytes: int = Field(
        512 * 1024, ge=1024, le=16 * 1024 * 1024,
        description="Largest grammar a request's constraints (response_format, forced tool calls) may compile to, "
                    "in bytes.",
    )
    max_image_bytes: int = Field(20 * 1024 * 1024, ge=1, description="Largest image accepted, in bytes.")
    max_image_pixels: int = Field(40_000_000, ge=1, description="Largest image accepted, width x height.")
    max_images_per_request: int = Field(16, ge=0, le=1024, description="Most images in one request (as vLLM's "
                                                                       "--limit-mm-per-prompt).")
    max_image_pixels_per_request: int = Field(
        50_000_000, ge=1, description="Most pixels (width x height) of all of one request's images together, read "
                                      "before any is decoded.")
    image_fetch_timeout: float = Field(10.0, gt=0, le=600, description="Seconds allowed to fetch one image URL, "
                                                                       "redirects included.")
    allowed_media_domains: list[str] = Field(
        [], description="An image host exempt from the public-address check, e.g. an intranet image server "
                        "(repeatable)."
    )


class ModelSettings(AnswerSettings, RequestLimits, LlamaCppSettings, TransformersSettings, VllmSettings):
    """One model's settings: what is served and on which engine (``EngineSettings``), the
    engines' flags, ``AnswerSettings`` and ``RequestLimits``."""


# each engine's settings class, by --engine name (the CLI help groups their flags in this order)
ENGINE_SETTINGS: dict[str, type[BaseModel]] = {
    "llama_cpp": LlamaCppSettings, "transformers": TransformersSettings, "vllm": VllmSettings,
}
