"""The Anthropic Messages request (``/v1/messages``, ``/v1/messages/count_tokens``) as a chat
request: ``to_chat_request``. Raises a 400 naming the block or field it cannot map.

Request mapping:

- ``system`` (a string or text blocks, joined by newlines) is the first system message; a
  ``system`` turn inside ``messages`` stays a system message where it stands. (Claude Code's
  ``x-anthropic-billing-header: ...`` block, first, is then the system message's first line,
  which ``--prompt-normalize`` removes before the prompt is rendered: ``chat/normalize.py``.)
- user ``text`` and ``image`` blocks (``base64`` or ``url`` sources, through the media policy)
  become content parts; each ``tool_result`` becomes a ``tool`` message (its text; ``is_error``
  prefixes ``Error: ``), in block order. Images in a ``tool_result`` (Claude Code reading an
  image file) follow the turn's tool messages as a user message for a vision model; a text model
  is told an image was there (``IMAGE_NOT_SHOWN``) and the session goes on. A ``tool_use`` must be answered by a ``tool_result`` in
  the next message, and a ``tool_result`` must answer one of the message before (Anthropic's
  400s, naming the message or block).
- assistant ``text`` blocks are its content, ``thinking`` blocks its ``reasoning_content`` (what
  the GLM-4.5+ template replays), ``tool_use`` blocks its ``tool_calls``;
  ``redacted_thinking`` (opaque to any other model) is dropped.
- ``tools`` are function tools (``input_schema`` -> ``parameters``); Anthropic's server tools
  (web search, web fetch, code execution) are left out unless ``tool_choice`` names one (a 400:
  ``serving/chat/hosted_tools.py``); ``tool_choice`` ``auto`` /
  ``any`` / ``tool`` / ``none`` -> ``auto`` / ``required`` / the named function / ``none``, and
  ``disable_parallel_tool_use`` -> ``parallel_tool_calls: false``.
- ``thinking`` ``enabled`` / ``disabled`` sets the template's ``enable_thinking`` (``enabled``'s
  ``budget_tokens`` is the ``thinking_token_budget``, under Anthropic's rules); ``adaptive``
  leaves the model's default; a request without ``thinking`` is ``disabled``, as on Anthropic's
  API: no thinking blocks (reasoning a model writes anyway, one whose template cannot turn it off,
  is dropped from the reply). Past reasoning is kept in the prompt (``PRESERVED_THINKING``).
  ``max_tokens`` is a ceiling (Claude Code always sends 32000).
- a final ``assistant`` turn is a prefill: the prompt ends inside it (``continue_final_message``)
  and the reply is its continuation (Anthropic's 400 when its text ends in whitespace).
  ``stop_sequences`` are up to ``MAX_STOP_SEQUENCES`` (Anthropic has no limit of 4).
  ``output_config.format`` (a JSON schema) is ``response_format`` ``json_schema``;
  ``output_config.effort`` is the request's ``reasoning_effort``.
"""

from __future__ import annotations

import json
from typing import Any

from glmserve.protocol.anthropic import CountTokensRequest, MessagesRequest
from glmserve.protocol.chat import ChatCompletionRequest
from glmserve.protocol.errors import invalid_request
from glmserve.serving.chat.mapped import chat_request, content_parts
from glmserve.serving.chat.hosted_tools import ANTHROPIC_HOSTED, leave_out

_CHOICES = {"auto": "auto", "any": "required", "none": "none"}


def _kind(block: Any, param: str) -> str:
    if not isinstance(block, dict) or not isinstance(block.get("type"), str):
        raise invalid_request("a content block must be an object with a 'type'", param)
    return block["type"]


def _text(block: dict, param: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise invalid_request("a text block needs 'text' (a string)", f"{param}.text")
    return text


def _texts(content: str | list, param: str) -> str:
    """Text-only content (a string or ``text`` blocks) as one string, blocks joined by newlines.
    Raises 400 naming the first block that is not text."""
    texts = content_parts(content, param, "blocks", _text_only)
    return texts if isinstance(texts, str) else "\n".join(texts)


def _text_only(block: Any, param: str) -> str:
    if _kind(block, param) != "text":
        raise invalid_request(f"only text blocks are accepted here, not {block['type']!r}", f"{param}.type")
    return _text(block, param)


def _image_part(block: dict, param: str) -> dict:
    """An ``image`` block as an OpenAI ``image_url`` part (base64 data as a data URL)."""
    source = block.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "base64" and isinstance(source.get("media_type"), str) and isinstance(source.get("data"), str):
        url = f"data:{source['media_type']};base64,{source['data']}"
    elif kind == "url" and isinstance(source.get("url"), str):
        url = source["url"]
    else:
        raise invalid_request("an image block needs a source of type 'base64' (media_type, data) or 'url' (url)",
                              f"{param}.source")
    return {"type": "image_url", "image_url": {"url": url}}


# what a text model is shown for an image a tool returned (Claude Code reading an image file):
# the session goes on, and the model knows an image was there
IMAGE_NOT_SHOWN = "[an image: this model reads text only, so it is not shown]"


def _tool_result(block: dict, where: str, vision: bool) -> tuple[dict, list[dict]]:
    """A ``tool_result`` block as ``(tool message, image parts)``: its text blocks are the tool
    message; its images are returned for a vision model, else replaced by ``IMAGE_NOT_SHOWN``."""
    if not isinstance(block.get("tool_use_id"), str):
        raise invalid_request("a tool_result block needs 'tool_use_id'", f"{where}.tool_use_id")
    content = block.get("content", "")
    texts, images = [], []
    for j, inner in enumerate(content if isinstance(content, list) else []):
        if _kind(inner, f"{where}.content.{j}") == "image":
            if vision:
                images.append(_image_part(inner, f"{where}.content.{j}"))
            else:
                texts.append(IMAGE_NOT_SHOWN)
        else:
            texts.append(_texts([inner], f"{where}.content.{j}"))
    text = "\n".join(texts) if isinstance(content, list) else _texts(content, f"{where}.content")
    return {"role": "tool", "tool_call_id": block["tool_use_id"],
            "content": f"Error: {text}" if block.get("is_error") else text}, images


def _user_messages(content: list, param: str, vision: bool) -> list[dict]:
    """A user turn's blocks as chat messages: ``tool`` messages for ``tool_result`` blocks and
    user messages for the text and images between them, in block order. Images inside tool
    results (chat tool messages carry text) follow the turn's tool messages as a user message."""
    out: list[dict] = []
    parts: list[dict] = []
    held: list[dict] = []  # tool results' images
    for j, block in enumerate(content):
        where = f"{param}.{j}"
        kind = _kind(block, where)
        if kind == "text":
            parts.append({"type": "text", "text": _text(block, where)})
        elif kind == "image":
            parts.append(_image_part(block, where))
        elif kind == "tool_result":
            if parts:
                out.append({"role": "user", "content": parts})
                parts = []
            message, images = _tool_result(block, where, vision)
            out.append(message)
            held += images
        else:
            raise invalid_request(f"content blocks of type {kind!r} are not supported in user messages "
                                  "(text, image and tool_result are)", f"{where}.type")
    if held or parts:
        out.append({"role": "user", "content": held + parts})
    return out


def _assistant_message(content: list, param: str) -> dict:
    texts, thinking, calls = [], [], []
    for j, block in enumerate(content):
        where = f"{param}.{j}"
        kind = _kind(block, where)
        if kind == "text":
            texts.append(_text(block, where))
        elif kind == "thinking":
            if not isinstance(block.get("thinking"), str):
                raise invalid_request("a thinking block needs 'thinking' (a string)", f"{where}.thinking")
            thinking.append(block["thinking"])
        elif kind == "redacted_thinking":
            continue  # encrypted reasoning of another model: nothing this one can read
        elif kind == "tool_use":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                raise invalid_request("a tool_use block needs 'id' and 'name'", where)
            if not isinstance(block.get("input", {}), dict):
                raise invalid_request("a tool_use block's 'input' must be an object", f"{where}.input")
            calls.append({"id": block["id"], "type": "function", "function": {
                "name": block["name"], "arguments": json.dumps(block.get("input", {}), ensure_ascii=False)}})
        else:
            raise invalid_request(f"content blocks of type {kind!r} are not supported in assistant messages "
                                  "(text, thinking, redacted_thinking and tool_use are)", f"{where}.type")
    message: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts) if texts else None}
    if thinking:
        message["reasoning_content"] = "\n".join(thinking)
    if calls:
        message["tool_calls"] = calls
    return message


def _ids(content: Any, kind: str, key: str) -> list[tuple[int, str]]:
    """``(block index, id)`` of each ``kind`` block in a message's content."""
    if not isinstance(content, list):
        return []
    return [(j, b.get(key)) for j, b in enumerate(content) if isinstance(b, dict) and b.get("type") == kind]


def _check_tool_pairs(req: CountTokensRequest) -> None:
    """Anthropic's pairing rule: the ``tool_use`` blocks of an assistant turn are answered by
    ``tool_result`` blocks in the next (user) message, and a ``tool_result`` answers a
    ``tool_use`` of the message before it. Raises 400 naming the message or block."""
    previous_uses: set[str] = set()
    for i, msg in enumerate(req.messages):
        results = _ids(msg.content, "tool_result", "tool_use_id") if msg.role == "user" else []
        for j, use_id in results:
            if use_id not in previous_uses:
                raise invalid_request(f"unexpected `tool_use_id` found in `tool_result` blocks: {use_id}. Each "
                                      "`tool_result` block must have a corresponding `tool_use` block in the previous "
                                      "message.", f"messages.{i}.content.{j}")
        uses = [use_id for _, use_id in _ids(msg.content, "tool_use", "id")] if msg.role == "assistant" else []
        if uses and i + 1 < len(req.messages):
            answered = {use_id for _, use_id in _ids(req.messages[i + 1].content, "tool_result", "tool_use_id")}
            missing = [use_id for use_id in uses if use_id not in answered]
            if req.messages[i + 1].role != "user" or missing:
                raise invalid_request("`tool_use` ids were found without `tool_result` blocks immediately after: "
                                      f"{', '.join(map(str, missing or uses))}. Each `tool_use` block must have a "
                                      "corresponding `tool_result` block in the next message.", f"messages.{i}")
        previous_uses = set(uses)


def to_chat_messages(req: CountTokensRequest, vision: bool = False) -> list[dict]:
    """``system`` and ``messages`` as chat messages. Raises 400 naming the block it cannot map,
    or a ``tool_use`` / ``tool_result`` without its other half."""
    _check_tool_pairs(req)
    system = _texts(req.system, "system") if req.system else ""  # its blocks joined by newlines
    out = [{"role": "system", "content": system}] if system else []
    for i, msg in enumerate(req.messages):
        param = f"messages.{i}.content"
        if msg.role == "system":
            out.append({"role": "system", "content": _texts(msg.content, param)})
        elif isinstance(msg.content, str):
            out.append({"role": msg.role, "content": msg.content})
        elif msg.role == "user":
            out += _user_messages(msg.content, param, vision)
        else:
            out.append(_assistant_message(msg.content, param))
    return out


def _tool_choice(req: CountTokensRequest) -> tuple[Any, bool | None]:
    """``(tool_choice, parallel_tool_calls)`` in chat terms."""
    choice = req.tool_choice
    if choice is None:
        return None, None
    parallel = False if choice.disable_parallel_tool_use else None
    if choice.type == "tool":
        if not choice.name:
            raise invalid_request("tool_choice of type 'tool' needs 'name'", "tool_choice.name")
        return {"type": "function", "function": {"name": choice.name}}, parallel
    return _CHOICES[choice.type], parallel


def thinking_mode(req: CountTokensRequest) -> str:
    """``enabled``, ``disabled`` or ``adaptive``; no ``thinking`` is ``disabled`` (Anthropic's default)."""
    return req.thinking.type if req.thinking else "disabled"


def to_chat_request(req: CountTokensRequest, vision: bool = False) -> ChatCompletionRequest:
    """The chat request that answers ``req`` (a Messages or count_tokens request) for a model
    that takes images (``vision``) or not. Raises 400 for what cannot be served: a forced server
    tool, a block type without a chat equivalent."""
    requested = req.tool_choice

    def forced(tool: dict) -> bool:
        return requested is not None and requested.type == "tool" and requested.name == tool.get("name")

    tools = []
    offered = [t.model_dump() for t in req.tools or []]
    for i, tool in leave_out(offered, ANTHROPIC_HOSTED, forced, "/v1/messages"):
        if tool["type"] not in (None, "custom"):
            raise invalid_request(f"tools of type {tool['type']!r} are not available on this server; client tools "
                                  "(name, description, input_schema) are, and server tools are left out",
                                  f"tools.{i}.type")
        tools.append({"type": "function", "function": {"name": tool["name"], "description": tool["description"],
                                                       "parameters": tool["input_schema"]}})
    choice, parallel = _tool_choice(req)
    only_hosted = bool(offered) and not tools  # every tool was a server tool, left out
    if choice is not None and not tools and choice != "none" and not (only_hosted and choice == "auto"):
        raise invalid_request(f"tool_choice {req.tool_choice.type!r} needs tools", "tool_choice")
    thinking = thinking_mode(req)
    messages = to_chat_messages(req, vision)
    body: dict[str, Any] = {
        "model": req.model, "messages": messages, "tools": tools or None,
        "tool_choice": choice if tools else None, "parallel_tool_calls": parallel,
    }
    if req.messages[-1].role == "assistant":  # a prefill: the reply continues its text
        if (messages[-1].get("content") or "") != (messages[-1].get("content") or "").rstrip():
            raise invalid_request("final assistant content cannot end with trailing whitespace",
                                  f"messages.{len(req.messages) - 1}.content")
        body.update(add_generation_prompt=False, continue_final_message=True)
    config = getattr(req, "output_config", None)  # a Messages request's (count_tokens has none)
    effort = config.effort if config else None
    body["chat_template_kwargs"] = {"enable_thinking": thinking == "enabled"} if thinking != "adaptive" else None
    body["reasoning_effort"] = effort
    if thinking == "enabled":
        budget = req.thinking.budget_tokens
        if budget is None:
            raise invalid_request("thinking.enabled.budget_tokens: Field required", "thinking.budget_tokens")
        if isinstance(req, MessagesRequest) and req.max_tokens <= budget:
            raise invalid_request("`max_tokens` must be greater than `thinking.budget_tokens`", "max_tokens")
        body["thinking_token_budget"] = budget
    if isinstance(req, MessagesRequest):
        body.update(max_tokens=req.max_tokens, temperature=req.temperature, top_p=req.top_p, top_k=req.top_k or None)
        fmt = req.output_config.format if req.output_config else None
        if fmt is not None:
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt.schema_}}
        # Anthropic's bound on stop_sequences (already checked) is not OpenAI's 4
        return chat_request(body, "messages").model_copy(update={"stop": req.stop_sequences})
    return chat_request(body, "messages")
