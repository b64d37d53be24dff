"""``/v1/responses`` bodies (OpenAI's Responses API, stateless subset): the request, the
``response`` object with its output items, and the streamed events. Shapes after OpenAI's API
reference and the ``openai`` package's ``types/responses``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from glmserve.protocol.chat import KeepAlive, _Lenient

MAX_INPUT_ITEMS = 4096


class FunctionTool(_Lenient):
    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class TextFormat(_Lenient):
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class TextConfig(_Lenient):
    format: TextFormat | None = None


class ReasoningConfig(_Lenient):
    """``reasoning``: ``effort`` drives the model's thinking switch (``none``/``minimal``: off)."""

    effort: Literal["none", "minimal", "low", "medium", "high"] | None = None


class ResponsesRequest(_Lenient):
    """``input``: a string (one user message) or a list of items: messages (``{"role",
    "content"}``, content a string or ``input_text``/``output_text``/``input_image`` parts),
    ``function_call`` and ``function_call_output`` items (``reasoning`` items are skipped)."""

    model: str
    keep_alive: KeepAlive = None
    input: str | list[dict[str, Any]] = Field(max_length=MAX_INPUT_ITEMS)
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    stream: bool = False
    store: bool | None = None
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None


class InputTokensDetails(BaseModel):
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
    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Literal["in_progress", "completed", "incomplete", "failed"]
    incomplete_details: IncompleteDetails | None = None
    error: Any = None
    model: str
    output: list[dict[str, Any]] = Field(default_factory=list)
    instructions: str | None = None
    tools: list[dict[str, Any]] = Field(default_factory=list)
    tool_choice: Any = "auto"
    parallel_tool_calls: bool = True
    temperature: float | None = None
    top_p: float | None = None
    max_output_tokens: int | None = None
    text: dict[str, Any] = Field(default_factory=lambda: {"format": {"type": "text"}})
    metadata: dict[str, str] = Field(default_factory=dict)
    previous_response_id: None = None
    store: bool = False
    truncation: Literal["disabled"] = "disabled"
    usage: ResponseUsage | None = None


class ResponseEvent(_Lenient):
    """One streamed event: ``type`` and ``sequence_number`` plus the event's own fields."""

    type: str
    sequence_number: int
