"""``/tokenize`` and ``/detokenize`` bodies, in vLLM's shapes (``vllm/entrypoints/openai/protocol.py``:
``TokenizeCompletionRequest``, ``TokenizeChatRequest``, ``TokenizeResponse``,
``DetokenizeRequest``, ``DetokenizeResponse``)."""

from __future__ import annotations

from typing import Annotated, Any, Union

from pydantic import BaseModel, Discriminator, Field, Tag

from glmserve.protocol.chat import ChatMessageParam, ToolDefinition, _Lenient

MAX_DETOKENIZE_TOKENS = 1 << 20


class TokenizeChatRequest(_Lenient):
    """Messages rendered with the model's chat template (tools included, as a chat request
    would render them), ending with the assistant's generation prompt."""

    model: str | None = None
    messages: list[ChatMessageParam] = Field(min_length=1)
    tools: list[ToolDefinition] | None = None
    return_token_strs: bool = False


class TokenizeCompletionRequest(_Lenient):
    """``prompt`` as it is; ``add_special_tokens``: add the model's BOS token if it wants one."""

    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool = False


def _kind(body: Any) -> str:
    chat = (body.get("messages") if isinstance(body, dict) else getattr(body, "messages", None)) is not None
    return "TokenizeChatRequest" if chat else "TokenizeCompletionRequest"


# a body with "messages" is the chat form, any other the prompt form (errors then name its fields;
# the tags are the class names, which error paths leave out as they do for untagged unions)
TokenizeRequest = Annotated[Union[Annotated[TokenizeChatRequest, Tag("TokenizeChatRequest")],
                                  Annotated[TokenizeCompletionRequest, Tag("TokenizeCompletionRequest")]],
                            Discriminator(_kind)]


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(_Lenient):
    model: str | None = None
    tokens: list[int] = Field(max_length=MAX_DETOKENIZE_TOKENS)


class DetokenizeResponse(BaseModel):
    prompt: str
