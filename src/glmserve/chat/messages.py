"""Map OpenAI request messages to the plain dicts chat templates expect.

Text parts are joined with newlines (the vLLM convention); for a vision model a message with
images keeps its parts as a list, ``{"type": "text", "text": ...}`` and ``{"type": "image"}`` in
order (Hugging Face's multimodal template convention); ``developer`` becomes ``system``
(templates know only the classic roles); assistant ``tool_calls`` are passed in the OpenAI
shape with ``arguments`` parsed to an object where it is JSON (what Hugging Face templates
iterate over), and their ``reasoning_content`` as is (GLM-4.5+ templates write it back as
``<think>...</think>`` in the turn since the last user message).
"""

from __future__ import annotations

import json
from typing import Any

from glmserve.protocol.chat import AssistantMessage, ChatMessageParam, ImagePart, TextPart, ToolMessage


class UnsupportedContentError(ValueError):
    """A message part this model cannot take (for example an image sent to a text model).

    ``param`` names the offending field (``messages.2.content.1``)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def _content(content: str | list | None, param: str, vision: bool) -> str | list[dict[str, str]] | None:
    if content is None or isinstance(content, str):
        return content
    if vision and any(isinstance(part, ImagePart) for part in content):
        return [{"type": "image"} if isinstance(part, ImagePart) else {"type": "text", "text": part.text}
                for part in content]
    texts: list[str] = []
    for j, part in enumerate(content):
        if isinstance(part, ImagePart):
            raise UnsupportedContentError(
                "this model does not accept image input", f"{param}.{j}"
            )
        if isinstance(part, TextPart):
            texts.append(part.text)
    return "\n".join(texts)


def image_urls(messages: list[ChatMessageParam]) -> list[tuple[str, str]]:
    """``(param, url)`` of every ``image_url`` part, in conversation order."""
    return [
        (f"messages.{i}.content.{j}", part.image_url.url)
        for i, msg in enumerate(messages) if isinstance(msg.content, list)
        for j, part in enumerate(msg.content) if isinstance(part, ImagePart)
    ]


def _arguments(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def to_template_messages(messages: list[ChatMessageParam], vision: bool = False) -> list[dict[str, Any]]:
    """Template-ready dicts for ``messages``; ``vision``: the model takes images. Raises
    ``UnsupportedContentError`` for an image sent to a model without vision."""
    out: list[dict[str, Any]] = []
    for i, msg in enumerate(messages):
        role = "system" if msg.role == "developer" else msg.role
        item: dict[str, Any] = {"role": role, "content": _content(msg.content, f"messages.{i}.content", vision)}
        if isinstance(msg, AssistantMessage):
            if item["content"] is None:
                item["content"] = ""
            if msg.reasoning_content is not None:  # GLM-4.5+ templates replay it in the current turn
                item["reasoning_content"] = msg.reasoning_content
            if msg.tool_calls:
                item["tool_calls"] = [
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {
                            "name": call.function.name,
                            "arguments": _arguments(call.function.arguments),
                        },
                    }
                    for call in msg.tool_calls
                ]
        if isinstance(msg, ToolMessage):
            item["tool_call_id"] = msg.tool_call_id
        if getattr(msg, "name", None):
            item["name"] = msg.name
        out.append(item)
    return out
