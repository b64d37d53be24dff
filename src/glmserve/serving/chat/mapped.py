"""Another API's request (``/v1/messages``, ``/v1/responses``) mapped onto chat fields, as a
validated chat request: one place where a mapped body fails as a 400 naming the field; and its
messages' content read part by part (``content_parts``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import ValidationError

from glmserve.protocol.chat import ChatCompletionRequest
from glmserve.protocol.errors import invalid_request


def chat_request(body: dict[str, Any], param: str) -> ChatCompletionRequest:
    """``body`` (another API's request mapped onto chat fields; None values dropped) as a chat
    request. Raises a 400 naming ``param`` and the chat field when it does not validate."""
    try:
        return ChatCompletionRequest.model_validate({k: v for k, v in body.items() if v is not None})
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(p) for p in error.get("loc", ()))
        raise invalid_request(f"{param} cannot be served as chat messages: {where}: {error.get('msg')}",
                              param) from exc


T = TypeVar("T")


def content_parts(content: Any, param: str, noun: str, part: Callable[[Any, str], T]) -> str | list[T]:
    """A message's ``content`` as it is when a string, else each of its parts as ``part(value,
    its param)`` gives it. Raises a 400 naming ``param`` unless it is a string or a list of
    ``noun`` (what ``part`` raises for a part it refuses)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid_request(f"content must be a string or a list of {noun}", param)
    return [part(value, f"{param}.{j}") for j, value in enumerate(content)]
