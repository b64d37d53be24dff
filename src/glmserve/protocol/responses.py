"""``/v1/responses`` bodies (OpenAI's Responses API, stateless subset): the request, the
``response`` object with its output items, and the streamed events. Shapes after OpenAI's API
reference and the ``openai`` package's ``types/responses``."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import re

from pydantic import BaseModel, Field, field_validator

from glmserve.protocol.chat import KeepAlive, Metadata, ReasoningEffort, _Lenient
from glmserve.protocol.usage import WithPrefillReport

MAX_INPUT_ITEMS = 4096
# the ``include`` values served: reasoning.encrypted_content, and those of hosted tools (left out
# here, so never in an output); others (logprobs, input image URLs) are a 400
INCLUDABLE = frozenset({"reasoning.encrypted_content", "web_search_call.action.sources", "web_search_call.results",
                        "file_search_call.results", "code_interpreter_call.outputs",
                        "computer_call_output.output.image_url"})


class TextFormat(_Lenient):
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class TextConfig(_Lenient):
    format: TextFormat | None = None


class ReasoningConfig(_Lenient):
    """``reasoning``: ``effort`` drives the model's thinking switch (``none``/``minimal``: off);
    ``summary`` is accepted (the reasoning itself is returned, as ``reasoning_text`` content)."""

    effort: ReasoningEffort | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None


class ResponsesRequest(_Lenient):
    """``input``: a string (one user message) or a list of items: messages (``{"role",
    "content"}``, content a string or ``input_text``/``output_text``/``input_image`` parts),
    ``function_call``, ``function_call_output`` and ``reasoning`` items (their text, or their
    ``encrypted_content``, is the turn's reasoning). ``include``: ``INCLUDABLE``."""

    model: str
    keep_alive: KeepAlive = None
    input: str | Annotated[list[dict[str, Any]], Field(max_length=MAX_INPUT_ITEMS)]  # a string: any length
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    top_logprobs: int | None = Field(None, ge=0, le=20)
    max_tool_calls: int | None = Field(None, ge=0)
    stream: bool = False
    store: bool | None = None
    background: bool | None = None
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None
    include: list[str] | None = Field(None, max_length=16)
    truncation: Literal["auto", "disabled"] | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    metadata: Metadata | None = None
    user: str | None = None
    cache_salt: str | None = Field(None, min_length=1, max_length=256)  # vLLM's: prefix caches apart (request_scope.py)
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    client_metadata: dict[str, Any] | None = None

    @field_validator("conversation")
    @classmethod
    def _conversation_id(cls, value: Any) -> str | None:
        """``"conv_..."`` or ``{"id": "conv_..."}``: the id."""
        if isinstance(value, dict):
            if not isinstance(value.get("id"), str):
                raise ValueError("conversation must be an id or an object with 'id'")
            return value["id"]
        return value

    @field_validator("instructions", "tools", "tool_choice", "metadata", "user", "safety_identifier",
                     "prompt_cache_key", "text")
    @classmethod
    def _encodable(cls, value: Any) -> Any:
        """The fields the response echoes must be valid Unicode: JSON allows a lone UTF-16
        surrogate (``"\\ud800"``), which no UTF-8 response can carry (a 400, not a 500)."""
        dumped = value.model_dump() if isinstance(value, BaseModel) else value
        if _has_lone_surrogate(dumped):
            raise ValueError("invalid Unicode: a lone surrogate")
        return value


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _has_lone_surrogate(value: Any) -> bool:
    if isinstance(value, str):
        return _LONE_SURROGATE.search(value) is not None
    if isinstance(value, dict):
        return any(_has_lone_surrogate(k) or _has_lone_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_lone_surrogate(v) for v in value)
    return False


class InputTokensDetails(WithPrefillReport):
    """``cached_tokens``: prompt tokens read from the prefix cache; ``prefill_start``: where the
    prefill started (glmserve's extension, ``protocol/usage.py``)."""

    cached_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"]


class Response(BaseModel):
    """The ``response`` object: every field of the Open Responses specification's
    ``ResponseResource`` (openresponses/openresponses ``schema/components/schemas/
    ResponseResource.json``: its required list), with its type, in every response and in the
    final streamed one. ``temperature``/``top_p``/penalties are the values generation used."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    completed_at: int | None = None
    status: Literal["queued", "in_progress", "completed", "incomplete", "failed", "cancelled"]
    incomplete_details: IncompleteDetails | None = None
    error: Any = None
    model: str
    previous_response_id: str | None = None
    conversation: dict[str, str] | None = None
    instructions: str | None = None
    output: list[dict[str, Any]] = Field(default_factory=list)
    tools: list[dict[str, Any]] = Field(default_factory=list)
    tool_choice: Any = "auto"
    truncation: Literal["auto", "disabled"] = "disabled"
    parallel_tool_calls: bool = True
    text: dict[str, Any] = Field(default_factory=lambda: {"format": {"type": "text"}})
    top_p: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    top_logprobs: int = 0
    temperature: float = 1.0
    reasoning: dict[str, Any] | None = None
    user: str | None = None
    usage: ResponseUsage | None = None
    max_output_tokens: int | None = None
    max_tool_calls: int | None = None
    store: bool = False
    background: bool = False
    service_tier: str = "default"
    metadata: dict[str, str] = Field(default_factory=dict)
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None


class ResponseEvent(_Lenient):
    """One streamed event: ``type`` and ``sequence_number`` plus the event's own fields."""

    type: str
    sequence_number: int
