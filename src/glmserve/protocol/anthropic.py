"""Anthropic Messages API wire types (``POST /v1/messages``, ``/v1/messages/count_tokens``) and
Anthropic's error envelope. No logic beyond shapes.

Source: Anthropic's API reference (Messages, Count tokens, Streaming messages, Errors) and the
``anthropic`` package's ``types``. Unknown request fields are tolerated (``extra="allow"``), as
Anthropic's own clients send beta fields (Claude Code: ``context_management``,
``output_config``); content blocks are plain dicts here and checked one by one in
``serving/messages/service.py``, which names the offending block in its 400.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from glmserve.protocol.chat import KeepAlive, ReasoningEffort, StopString, _Lenient
from glmserve.protocol.errors import APIError, ErrorInfo
from glmserve.protocol.usage import WithPrefillReport

# bounds on the lists a request holds (each item is rendered into the prompt); the body itself is
# bounded by --max-request-bytes. Claude Code's compaction request was seen with 6361 blocks in one
# message.
MAX_MESSAGES = 100_000
MAX_BLOCKS = 100_000
Blocks = Annotated[list[dict[str, Any]], Field(max_length=MAX_BLOCKS)]  # a string has no bound but the body's
# Anthropic documents no limit on stop_sequences; each is searched for after every token
# (serving/generation/stop.py), so their number is bounded here
MAX_STOP_SEQUENCES = 32


class Tool(_Lenient):
    """A client tool. ``type`` is absent or ``custom``; Anthropic's server tools (``web_search_...``,
    ``bash_...``) name another type and are refused."""

    name: str
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    type: str | None = None


class ToolChoice(_Lenient):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class ThinkingConfig(_Lenient):
    """``enabled`` / ``disabled`` turn the model's thinking switch on or off; ``adaptive`` (what
    Claude Code sends) leaves the model's default. ``budget_tokens`` (Anthropic's rules: needed
    with ``enabled``, at least 1024, below ``max_tokens``) ends the reasoning after that many
    tokens (``serving/generation/reasoning_budget.py``)."""

    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(None, ge=1024)


class OutputFormat(_Lenient):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(_Lenient):
    """``format``: Anthropic's structured outputs (the reply is a JSON document of the schema,
    enforced as ``response_format`` is); ``effort`` is the request's ``reasoning_effort`` (GLM-5.x
    templates read it; on others it sets a thinking budget: ``serving/generation/template_vars.py``)."""

    format: OutputFormat | None = None
    effort: ReasoningEffort | None = None


class MessageParam(_Lenient):
    """One turn. ``system`` here is a mid-conversation system message (Claude Code's
    ``mid-conversation-system`` beta); ``content`` is a string or a list of blocks (``text``,
    ``image``, ``tool_use``, ``tool_result``, ``thinking``, ``redacted_thinking``)."""

    role: Literal["user", "assistant", "system"]
    content: str | Blocks


class CountTokensRequest(_Lenient):
    """The body of ``/v1/messages/count_tokens``: a Messages request without ``max_tokens``."""

    model: str
    keep_alive: KeepAlive = None
    messages: list[MessageParam] = Field(min_length=1, max_length=MAX_MESSAGES)
    system: str | Blocks | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None


class MessagesRequest(CountTokensRequest):
    """``POST /v1/messages``. ``max_tokens`` is required, as Anthropic requires it, and is a
    ceiling: when the prompt leaves less of the context, the reply gets what is left.
    ``temperature`` is 0..1 (Anthropic's range); ``top_k`` 0 means no top-k;
    ``stop_sequences``: at most ``MAX_STOP_SEQUENCES`` (each is matched after every token). A
    final ``assistant`` message is a prefill: the reply continues its text."""

    max_tokens: int = Field(ge=1)
    stop_sequences: list[StopString] | None = Field(None, max_length=MAX_STOP_SEQUENCES)
    temperature: float | None = Field(None, ge=0.0, le=1.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    metadata: dict[str, Any] | None = None
    output_config: OutputConfig | None = None
    stream: bool = False


class Usage(WithPrefillReport):
    """Token counts as Anthropic gives them: the prompt is ``input_tokens`` (not served from the
    prefix cache) plus ``cache_read_input_tokens`` (served from it); glmserve writes no separate
    cache, so ``cache_creation_input_tokens`` is 0. ``prefill_start``: where the prefill started
    (glmserve's extension, ``protocol/usage.py``)."""

    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0


StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


class Message(BaseModel):
    """The reply: ``content`` holds ``thinking``, ``text`` and ``tool_use`` blocks, in that order.
    Dumped whole (nulls included, as Anthropic sends ``stop_sequence: null``)."""

    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[dict[str, Any]] = Field(default_factory=list)
    stop_reason: StopReason | None = None
    stop_sequence: str | None = None
    usage: Usage


class MessageStreamEvent(_Lenient):
    """One streamed event (``message_start``, ``content_block_start``, ``content_block_delta``,
    ``content_block_stop``, ``message_delta``, ``message_stop``, ``ping``, ``error``): ``type``
    plus the event's own fields. Sent as SSE ``event: <type>`` with the whole object as ``data``."""

    type: str


class CountTokensResponse(BaseModel):
    input_tokens: int


class ErrorDetail(BaseModel):
    type: str
    message: str


class ErrorEnvelope(BaseModel):
    """Anthropic's error body (documentation of the routes; built by ``error_body``)."""

    type: Literal["error"] = "error"
    error: ErrorDetail


# Anthropic's error types by HTTP status (API reference, "Errors"); 529 is its "overloaded".
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 408: "invalid_request_error", 413: "request_too_large",
               429: "rate_limit_error", 500: "api_error", 529: "overloaded_error"}
OVERLOADED = 529


def error_status(exc: APIError) -> int:
    """The status an Anthropic client gets for ``exc``: the same, except that 503 (the server
    is shutting down, or its engine cannot serve) is Anthropic's 529 ``overloaded_error``,
    which Anthropic's SDKs retry."""
    return OVERLOADED if exc.status_code == 503 else exc.status_code


# OpenAI-side error codes that mean "not now" (the server is shutting down, its engine or the
# model cannot serve): Anthropic's overloaded_error, which its SDKs retry
OVERLOADED_CODES = frozenset({"server_shutting_down", "engine_unhealthy", "model_busy"})


def stream_error_type(error: ErrorInfo) -> str:
    """The Anthropic ``error`` event type for an error body sent after a stream began (no HTTP
    status there): ``overloaded_error`` for ``OVERLOADED_CODES``, the same type where
    Anthropic has it, else ``api_error``."""
    if error.code in OVERLOADED_CODES:
        return "overloaded_error"
    return error.type if error.type in ERROR_TYPES.values() else "api_error"


def error_body(exc: APIError) -> dict[str, Any]:
    """Anthropic's envelope for ``exc``: ``{"type": "error", "error": {"type", "message"}}``;
    the message names the field (``param``) when there is one."""
    status = error_status(exc)
    kind = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    message = f"{exc.param}: {exc.message}" if exc.param and exc.param not in exc.message else exc.message
    return {"type": "error", "error": {"type": kind, "message": message}}


__all__ = ["CountTokensRequest", "CountTokensResponse", "ErrorEnvelope", "Message", "MessageParam",
           "MessageStreamEvent", "MessagesRequest", "ThinkingConfig", "Tool", "ToolChoice", "Usage",
           "error_body", "error_status", "stream_error_type"]
