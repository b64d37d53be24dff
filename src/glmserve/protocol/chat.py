"""OpenAI Chat Completions wire types (pydantic v2). No logic.

Source: the OpenAI API reference for ``POST /v1/chat/completions`` and its streaming chunk
object. Unknown request fields are tolerated (``extra="allow"``); wrong types and out-of-range
values fail validation, which the HTTP layer answers with a 400.
Extensions beyond OpenAI (the common ones vLLM and llama.cpp accept): ``top_k``, ``min_p``,
``repetition_penalty``, ``ignore_eos``, ``chat_template_kwargs`` (extra variables for the chat
template, e.g. GLM-4.5's ``enable_thinking``), ``thinking_token_budget`` (vLLM's: reasoning tokens
before the reasoning is ended, ``serving/generation/reasoning_budget.py``); in responses vLLM's
``stop_reason`` (the stop string that ended the choice, absent otherwise).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer,
                      model_validator)

from glmserve.protocol.usage import WithPrefillReport

MAX_STOP_SEQUENCES = 4  # OpenAI: "Up to 4 sequences where the API will stop generating"
# glmserve's bound: a stop string is matched against held-back text after every token
MAX_STOP_LENGTH = 512
StopString = Annotated[str, Field(max_length=MAX_STOP_LENGTH)]

# the reasoning levels a request may ask for (OpenAI's, and the "xhigh" / "max" of llama-server and GLM-5.x)
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]


class _Lenient(BaseModel):
    """A request body: unknown fields tolerated, known ones strictly typed (``"stream": "yes"``
    or ``"max_tokens": "5"`` is a 400, as on OpenAI's and Anthropic's APIs, not coerced)."""

    model_config = ConfigDict(extra="allow", strict=True)


def _keep_alive(value: Any) -> float | None:
    from glmserve.models.keep_alive import parse_keep_alive

    return None if value is None else parse_keep_alive(value)


# Ollama's keep_alive (an extension on every request that names a model): how long the model
# stays loaded after this request on a server of several models; seconds once parsed (inf: keep)
KeepAlive = Annotated[float | None, BeforeValidator(_keep_alive)]

# OpenAI's ``metadata`` (responses, conversations, batches): "Set of 16 key-value pairs ...
# Keys are strings with a maximum length of 64 characters. Values are strings with a maximum
# length of 512 characters."
Metadata = Annotated[dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=512)]],
                     Field(max_length=16)]


# ---- request: messages -------------------------------------------------------------------


class TextPart(_Lenient):
    type: Literal["text"]
    text: str


class ImageURL(_Lenient):
    url: str
    detail: Literal["auto", "low", "high"] | None = None


class ImagePart(_Lenient):
    type: Literal["image_url"]
    image_url: ImageURL


ContentPart = Annotated[Union[TextPart, ImagePart], Field(discriminator="type")]


class FunctionCall(BaseModel):
    name: str
    arguments: str


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class SystemMessage(_Lenient):
    role: Literal["system"]
    content: str | list[TextPart]
    name: str | None = None


class DeveloperMessage(_Lenient):
    role: Literal["developer"]
    content: str | list[TextPart]
    name: str | None = None


class UserMessage(_Lenient):
    role: Literal["user"]
    content: str | list[ContentPart]
    name: str | None = None


class AssistantMessage(_Lenient):
    role: Literal["assistant"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    reasoning_content: str | None = None


class ToolMessage(_Lenient):
    role: Literal["tool"]
    content: str | list[TextPart]
    tool_call_id: str


ChatMessageParam = Annotated[
    Union[SystemMessage, DeveloperMessage, UserMessage, AssistantMessage, ToolMessage],
    Field(discriminator="role"),
]


# ---- request: options --------------------------------------------------------------------


class StreamOptions(_Lenient):
    include_usage: bool = False


class ResponseFormat(_Lenient):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


class FunctionDefinition(_Lenient):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDefinition(_Lenient):
    type: Literal["function"]
    function: FunctionDefinition


class SamplingRequest(_Lenient):
    """The fields a chat completion and a text completion request share (OpenAI's
    ``CreateChatCompletionRequest`` and ``CreateCompletionRequest``, with vLLM's sampling
    extensions): the model, how many choices and how each is sampled, stop strings, streaming.
    Each request adds its own ``max_tokens`` (its default differs) and ``logprobs`` (a bool on
    chat, a count on completions)."""

    model: str
    keep_alive: KeepAlive = None
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    n: int = Field(1, ge=1, le=128)
    seed: int | None = Field(None, ge=-(2**63), le=2**64 - 1)
    stop: StopString | Annotated[list[StopString], Field(max_length=MAX_STOP_SEQUENCES)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    user: str | None = None
    # extensions
    cache_salt: str | None = Field(None, min_length=1, max_length=256)  # vLLM's: prefix caches apart (request_scope.py)
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=10.0)
    ignore_eos: bool = False


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessageParam] = Field(min_length=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    response_format: ResponseFormat | None = None
    tools: list[ToolDefinition] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    # extensions
    chat_template_kwargs: dict[str, Any] | None = None
    # vLLM's: the prompt ends with the assistant's opening (default) or inside the final message,
    # whose text the reply continues (a prefill); not both
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    # OpenAI's reasoning switch; on a model with a thinking switch, "none" and "minimal" turn it off
    # (llama-server's and GLM-5.x's "xhigh" and "max" too; serving/generation/template_vars.py)
    reasoning_effort: ReasoningEffort | None = None
    thinking_token_budget: int | None = Field(None, ge=0)


    @model_validator(mode="after")
    def _one_prompt_end(self) -> ChatCompletionRequest:
        if self.continue_final_message and self.add_generation_prompt:
            raise ValueError("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
        return self


# ---- response ----------------------------------------------------------------------------


class PromptTokensDetails(WithPrefillReport):
    """``cached_tokens``: prompt tokens read from the prefix cache; ``prefill_start``: where the
    prefill started (glmserve's extension, ``protocol/usage.py``)."""

    cached_tokens: int = 0


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class KeepsNull(BaseModel):
    """A response object whose ``KEEP_NULL`` fields are written as ``null`` when unset, also
    when it is dumped with ``exclude_none`` (which drops every other unset field, e.g. vLLM's
    ``stop_reason``): OpenAI sends these fields in every object, ``null`` or not, and clients
    that read the JSON themselves test them (``choice.finish_reason !== null``)."""

    KEEP_NULL: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _keep_null(self, handler: SerializerFunctionWrapHandler) -> dict:
        data = handler(self)
        for name in self.KEEP_NULL:
            data.setdefault(name, None)
        return data


class ChatMessage(KeepsNull):
    """The reply; ``content`` is always present, ``null`` beside ``tool_calls`` as OpenAI sends it
    (also when the response is dumped with ``exclude_none``)."""

    KEEP_NULL = ("content",)
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    tool_calls: list[ToolCall] | None = None
    reasoning_content: str | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprobEntry(BaseModel):
    """One generated token: its text, log-probability, UTF-8 bytes and the most likely
    alternatives (``top_logprobs``)."""

    token: str
    logprob: float
    bytes: list[int] | None = None
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprobEntry] | None = None


class Choice(KeepsNull):
    KEEP_NULL = ("finish_reason", "logprobs")
    index: int = 0
    message: ChatMessage
    finish_reason: Literal["stop", "length", "tool_calls"] | None
    logprobs: ChoiceLogprobs | None = None
    stop_reason: str | None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage


class DeltaFunction(BaseModel):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(BaseModel):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunction


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChunkChoice(KeepsNull):
    """A choice's piece; ``finish_reason`` and ``logprobs`` are ``null`` until set, as OpenAI
    streams them."""

    KEEP_NULL = ("finish_reason", "logprobs")
    index: int = 0
    delta: DeltaMessage
    finish_reason: Literal["stop", "length", "tool_calls"] | None = None
    logprobs: ChoiceLogprobs | None = None
    stop_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
