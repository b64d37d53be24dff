"""The ``/v1/responses`` request as a chat request: ``function_tools`` and ``to_chat_request``.
Raises a 400 naming the item, tool or field it cannot map.

- ``instructions`` is the first system message; ``input`` (a string: one user message) items:
  ``message`` (roles user, assistant, system, developer; a string or ``input_text`` /
  ``output_text`` / ``refusal`` / ``input_image`` parts), ``function_call``,
  ``function_call_output``, ``reasoning``.
- A ``reasoning`` item is the ``reasoning_content`` of the assistant turn that follows it (its
  ``encrypted_content``, opened by ``serving/responses/sealed_reasoning.py``, else its ``reasoning_text``
  content, else its summary); an assistant message with the ``function_call`` items after it is
  one turn: the history is rendered as the reply was generated, so the prompt extends the
  previous request's.
- Calls and outputs pair up as on OpenAI's API: a ``function_call_output`` whose ``call_id`` no
  earlier ``function_call`` has, or a ``function_call`` no output answers, is a 400 naming the
  item.
- Tools: ``function`` tools, and the functions inside a ``namespace`` tool (Codex CLI's), offered
  by their own names; hosted tools are left out (``serving/chat/hosted_tools.py``); any other type
  (``custom``, ``local_shell``...) is a 400 naming it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from glmserve.protocol.chat import ChatCompletionRequest
from glmserve.protocol.errors import invalid_request
from glmserve.protocol.responses import ResponsesRequest
from glmserve.serving.chat.mapped import chat_request, content_parts
from glmserve.serving.chat.hosted_tools import OPENAI_HOSTED, leave_out

# opens an item's encrypted_content (token, param) -> reasoning text; raises a 400
OpenReasoning = Callable[[str, str], str]


def _text_of(content: Any, param: str) -> str | list[dict]:
    """A Responses message content -> chat content (a string, or text and image parts)."""
    return content_parts(content, param, "parts", _chat_part)


def _chat_part(part: Any, param: str) -> dict:
    """A Responses content part as a chat content part; 400 for one that cannot be."""
    kind = part.get("type") if isinstance(part, dict) else None
    if kind in ("input_text", "output_text", "text"):
        return {"type": "text", "text": part.get("text", "")}
    if kind == "refusal":
        return {"type": "text", "text": part.get("refusal", "")}
    if kind == "input_image" and isinstance(part.get("image_url"), str):
        return {"type": "image_url", "image_url": {"url": part["image_url"]}}
    raise invalid_request(f"unsupported content part {kind!r}", param)


def _reasoning_text(item: dict, param: str, open_reasoning: OpenReasoning) -> str:
    """The reasoning a ``reasoning`` input item holds: its ``encrypted_content`` opened (a 400
    when it does not open), else its ``reasoning_text`` parts (what this server returns), else
    its summary."""
    sealed = item.get("encrypted_content")
    if sealed is not None:
        if not isinstance(sealed, str):
            raise invalid_request("encrypted_content must be a string", f"{param}.encrypted_content")
        return open_reasoning(sealed, f"{param}.encrypted_content")
    for key in ("content", "summary"):
        parts = item.get(key)
        if isinstance(parts, list) and parts:
            return "".join(p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _check_calls_answered(items: list[dict]) -> None:
    """OpenAI's pairing rule: every ``function_call_output`` answers an earlier
    ``function_call`` (by ``call_id``), and every ``function_call`` is answered."""
    calls: dict[str, int] = {}
    answered: set[str] = set()
    for i, item in enumerate(items):
        kind = item.get("type", "message")
        call_id = item.get("call_id")
        if kind in ("function_call", "function_call_output") and not isinstance(call_id, str):
            raise invalid_request(f"a {kind} item needs 'call_id' (a string)", f"input.{i}.call_id")
        if kind == "function_call":
            calls[call_id] = i
        elif kind == "function_call_output":
            if call_id not in calls:
                raise invalid_request(f"No tool call found for function call output with call_id {call_id}.",
                                      f"input.{i}.call_id")
            answered.add(call_id)
    for call_id, i in calls.items():
        if call_id not in answered:
            raise invalid_request(f"No tool output found for function call {call_id}.", f"input.{i}")


def to_chat_messages(req: ResponsesRequest, open_reasoning: OpenReasoning) -> list[dict]:
    """``instructions`` and ``input`` as chat messages. Raises 400 naming the item."""
    messages: list[dict] = [{"role": "system", "content": req.instructions}] if req.instructions else []
    items = [{"role": "user", "content": req.input}] if isinstance(req.input, str) else req.input
    _check_calls_answered(items)
    reasoning: list[str] = []  # reasoning items waiting for their assistant turn

    def assistant(message: dict) -> dict:
        if reasoning:
            message["reasoning_content"] = "".join(reasoning)
            reasoning.clear()
        return message

    for i, item in enumerate(items):
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise invalid_request(f"unsupported role {role!r}", f"input.{i}.role")
            message = {"role": role, "content": _text_of(item.get("content", ""), f"input.{i}.content")}
            messages.append(assistant(message) if role == "assistant" else message)
        elif kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments", "{}")}}
            last = messages[-1] if messages else None
            if last and last["role"] == "assistant" and not reasoning:  # the same turn: its text, parallel calls
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append(assistant({"role": "assistant", "content": None, "tool_calls": [call]}))
        elif kind == "function_call_output":
            output = item.get("output", "")
            if isinstance(output, list):  # content parts
                text = "\n".join(str(p.get("text", "")) for p in output if isinstance(p, dict))
            else:
                text = output if isinstance(output, str) else json.dumps(output)
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": text})
        elif kind == "reasoning":
            reasoning.append(_reasoning_text(item, f"input.{i}", open_reasoning))
        else:
            raise invalid_request(f"unsupported input item type {kind!r}", f"input.{i}.type")
    return messages


def _function(tool: dict, param: str) -> dict:
    if tool.get("type") != "function":
        raise invalid_request(f"tools of type {tool.get('type')!r} are not supported here (function and namespace "
                              "tools are; hosted tools are left out)", f"{param}.type")
    if not isinstance(tool.get("name"), str):
        raise invalid_request("a function tool needs 'name' (a string)", f"{param}.name")
    return {"type": "function", "function": {k: tool[k] for k in ("name", "description", "parameters", "strict")
                                             if k in tool}}


def function_tools(req: ResponsesRequest) -> tuple[list[dict], dict[str, str]]:
    """``(tools, namespaces)``: the request's tools as chat function tools, and the namespace of
    each function offered inside a ``namespace`` tool (by function name). A namespace's functions
    are offered to the model by their own names. Hosted tools are left out
    (``serving/chat/hosted_tools.py``). Raises 400 naming any other tool type (``custom``,
    ``local_shell``...)."""
    choice = req.tool_choice

    def forced(tool: dict) -> bool:
        return isinstance(choice, dict) and choice.get("type") == tool.get("type")

    tools, namespaces = [], {}
    for i, tool in leave_out(req.tools or [], OPENAI_HOSTED, forced, "/v1/responses"):
        if tool.get("type") != "namespace":
            tools.append(_function(tool, f"tools.{i}"))
            continue
        inner = tool.get("tools")
        if not isinstance(tool.get("name"), str) or not isinstance(inner, list):
            raise invalid_request("a namespace tool needs 'name' and 'tools' (a list)", f"tools.{i}")
        for j, fn in enumerate(inner):
            if not isinstance(fn, dict):
                raise invalid_request("a tool must be an object", f"tools.{i}.tools.{j}")
            tools.append(_function(fn, f"tools.{i}.tools.{j}"))
            namespaces[fn.get("name")] = tool["name"]
    return tools, namespaces


def to_chat_request(req: ResponsesRequest, tools: list[dict], open_reasoning: OpenReasoning) -> ChatCompletionRequest:
    """The chat request that answers ``req``, offering ``tools`` (``function_tools``');
    ``open_reasoning`` opens reasoning items' ``encrypted_content``. Raises 400 for what the chat
    API cannot carry."""
    choice = req.tool_choice
    if isinstance(choice, dict) and choice.get("type") == "function" and "function" not in choice:
        choice = {"type": "function", "function": {"name": choice.get("name")}}
    body: dict[str, Any] = {"model": req.model, "messages": to_chat_messages(req, open_reasoning),
                            "tools": tools or None, "tool_choice": choice,
                            "parallel_tool_calls": req.parallel_tool_calls,
                            "max_completion_tokens": req.max_output_tokens, "temperature": req.temperature,
                            "top_p": req.top_p, "presence_penalty": req.presence_penalty,
                            "frequency_penalty": req.frequency_penalty,
                            "reasoning_effort": req.reasoning.effort if req.reasoning else None}
    fmt = req.text.format if req.text else None
    if fmt is not None and fmt.type == "json_object":
        body["response_format"] = {"type": "json_object"}
    elif fmt is not None and fmt.type == "json_schema":
        if fmt.name is None:  # required, as on OpenAI's API
            raise invalid_request("Missing required parameter: 'text.format.name'.", "text.format.name",
                                  "missing_required_parameter")
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", fmt.name):
            raise invalid_request("text.format.name must be 1 to 64 letters, digits, '_' or '-'", "text.format.name")
        if fmt.schema_ is None:
            raise invalid_request("text.format json_schema needs a schema", "text.format.schema")
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": fmt.name, "schema": fmt.schema_}}
    return chat_request(body, "input")
