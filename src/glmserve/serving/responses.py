"""``/v1/responses`` (OpenAI's Responses API), stateless, on top of the chat handler: the
request's ``input`` items become chat messages, the chat completion (or its chunks) becomes the
``response`` object (or its typed events). Nothing is stored: ``store: true`` and
``previous_response_id`` are 400s.

Items: a message's text becomes an ``output_text`` part of a ``message`` item; each tool call
a ``function_call`` item (``call_id`` = the chat tool call's id); the model's reasoning a
``reasoning`` item before them (its text in ``content`` as ``reasoning_text``, Open Responses'
layout). Reasoning items sent back in ``input`` are replayed to the template as the turn's
``reasoning_content``, and past reasoning is kept in the prompt (``PRESERVED_THINKING``). A
reply cut by ``max_output_tokens`` is ``status: "incomplete"`` with
``incomplete_details.reason: "max_output_tokens"``.

Stream events (OpenAI's): ``response.created``, ``response.in_progress``, then per item
``response.output_item.added``, its deltas (``response.output_text.delta`` inside
``response.content_part.added``/``done``, ``response.function_call_arguments.delta``,
``response.reasoning_text.delta``) and ``...done`` events, ``response.output_item.done``, and
last ``response.completed`` (or ``response.incomplete``) carrying the whole response; a failure
after the start is an ``error`` event.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from glmserve.protocol.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionRequest, StreamOptions, Usage
from glmserve.protocol.errors import ErrorResponse, invalid_request
from glmserve.protocol.responses import (
    IncompleteDetails,
    InputTokensDetails,
    OutputTokensDetails,
    Response,
    ResponseEvent,
    ResponsesRequest,
    ResponseUsage,
)
from glmserve.serving.chat import ChatService, chat_request
from glmserve.serving.chunks import ChunkStream
from glmserve.serving.hosted_tools import OPENAI_HOSTED, leave_out
from glmserve.serving.template_vars import PRESERVED_THINKING, with_template_defaults


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _text_of(content: Any, param: str) -> str | list[dict]:
    """A Responses message content -> chat content (a string, or text and image parts)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid_request("content must be a string or a list of parts", param)
    parts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text"):
            parts.append({"type": "text", "text": part.get("text", "")})
        elif kind == "refusal":
            parts.append({"type": "text", "text": part.get("refusal", "")})
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            parts.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
        else:
            raise invalid_request(f"unsupported content part {kind!r}", f"{param}.{j}")
    return parts


def _reasoning_text(item: dict) -> str:
    """The readable text of a ``reasoning`` input item: its ``reasoning_text`` parts (what this
    server returns), else its summary; nothing for encrypted reasoning alone."""
    for key in ("content", "summary"):
        parts = item.get(key)
        if isinstance(parts, list) and parts:
            return "".join(p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def to_chat_messages(req: ResponsesRequest) -> list[dict]:
    """``instructions`` and ``input`` as chat messages. Raises 400 naming the item.

    A ``reasoning`` item is the ``reasoning_content`` of the assistant turn that follows it, and
    an assistant message with the ``function_call`` items after it is one turn: the history is
    rendered as the reply was generated, so the prompt extends the previous request's."""
    messages: list[dict] = [{"role": "system", "content": req.instructions}] if req.instructions else []
    items = [{"role": "user", "content": req.input}] if isinstance(req.input, str) else req.input
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
            reasoning.append(_reasoning_text(item))
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
    (``serving/hosted_tools.py``). Raises 400 naming any other tool type (``custom``,
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


def to_chat_request(req: ResponsesRequest, tools: list[dict]) -> ChatCompletionRequest:
    """The chat request that answers ``req``, offering ``tools`` (``function_tools``'). Raises
    400 for what the chat API cannot carry."""
    choice = req.tool_choice
    if isinstance(choice, dict) and choice.get("type") == "function" and "function" not in choice:
        choice = {"type": "function", "function": {"name": choice.get("name")}}
    body: dict[str, Any] = {"model": req.model, "messages": to_chat_messages(req), "tools": tools or None,
                            "tool_choice": choice, "parallel_tool_calls": req.parallel_tool_calls,
                            "max_completion_tokens": req.max_output_tokens, "temperature": req.temperature,
                            "top_p": req.top_p, "reasoning_effort": req.reasoning.effort if req.reasoning else None}
    fmt = req.text.format if req.text else None
    if fmt is not None and fmt.type == "json_object":
        body["response_format"] = {"type": "json_object"}
    elif fmt is not None and fmt.type == "json_schema":
        if fmt.schema_ is None:
            raise invalid_request("text.format json_schema needs a schema", "text.format.schema")
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": fmt.name or "output",
                                                                          "schema": fmt.schema_}}
    return chat_request(body, "input")


def _usage(usage: Usage | None) -> ResponseUsage | None:
    if usage is None:
        return None
    cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0
    return ResponseUsage(input_tokens=usage.prompt_tokens,
                         input_tokens_details=InputTokensDetails(cached_tokens=cached),
                         output_tokens=usage.completion_tokens, output_tokens_details=OutputTokensDetails(),
                         total_tokens=usage.total_tokens)


def _message_item(item_id: str, text: str, status: str = "completed") -> dict:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}] if status == "completed" else []}


def _call_item(item_id: str, call_id: str, name: str, arguments: str, namespaces: dict[str, str],
               status: str = "completed") -> dict:
    """A ``function_call`` item; a function offered inside a ``namespace`` tool carries its
    ``namespace``, as OpenAI returns a namespaced call."""
    item = {"type": "function_call", "id": item_id, "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}
    if name in namespaces:
        item["namespace"] = namespaces[name]
    return item


def _reasoning_item(item_id: str, text: str | None) -> dict:
    return {"type": "reasoning", "id": item_id, "summary": [],
            "content": [{"type": "reasoning_text", "text": text}] if text is not None else []}


class ResponsesService:
    """Serve ``/v1/responses`` over a ``ChatService``. ``create(req)`` returns a ``Response``
    or, for ``stream=True``, an async iterator of ``ResponseEvent``s. Client errors raise
    ``APIError`` before anything is generated."""

    def __init__(self, chat: ChatService) -> None:
        self.chat = chat

    async def create(self, req: ResponsesRequest) -> Response | AsyncIterator[ResponseEvent | ErrorResponse]:
        if req.store:
            raise invalid_request("responses are not stored on this server: leave store out or set it to false",
                                  "store")
        if req.previous_response_id:
            raise invalid_request("responses are not stored on this server, so previous_response_id cannot be "
                                  "used: send the whole conversation in input", "previous_response_id")
        tools, namespaces = function_tools(req)
        chat_req = with_template_defaults(to_chat_request(req, tools), PRESERVED_THINKING,
                                          self.chat.default_template_kwargs)
        shell = Response(id=_id("resp"), created_at=int(time.time()), status="in_progress", model=req.model,
                         instructions=req.instructions, tools=req.tools or [],
                         tool_choice=req.tool_choice if req.tool_choice is not None else "auto",
                         parallel_tool_calls=req.parallel_tool_calls is not False, temperature=req.temperature,
                         top_p=req.top_p, max_output_tokens=req.max_output_tokens, metadata=req.metadata or {},
                         text=req.text.model_dump(by_alias=True, exclude_none=True) if req.text else {
                             "format": {"type": "text"}})
        if not req.stream:
            completion = await self.chat.create(chat_req)
            return self._finish(shell, self._items(completion, namespaces), completion.choices[0].finish_reason,
                                completion.usage)
        stream_req = chat_req.model_copy(update={"stream": True, "stream_options": StreamOptions(include_usage=True)})
        chunks = await self.chat.create(stream_req)
        return ChunkStream(self._events(shell, chunks, namespaces), chunks)

    @staticmethod
    def _items(completion: ChatCompletion, namespaces: dict[str, str]) -> list[dict]:
        message = completion.choices[0].message
        items = [_reasoning_item(_id("rs"), message.reasoning_content)] if message.reasoning_content else []
        if message.content:
            items.append(_message_item(_id("msg"), message.content))
        items += [_call_item(_id("fc"), c.id, c.function.name, c.function.arguments, namespaces)
                  for c in message.tool_calls or []]
        return items

    @staticmethod
    def _finish(shell: Response, items: list[dict], finish_reason: str | None, usage: Usage | None) -> Response:
        incomplete = finish_reason == "length"
        return shell.model_copy(update={
            "status": "incomplete" if incomplete else "completed", "output": items, "usage": _usage(usage),
            "incomplete_details": IncompleteDetails(reason="max_output_tokens") if incomplete else None})

    async def _events(self, shell: Response, chunks: AsyncIterator[ChatCompletionChunk | ErrorResponse],
                      namespaces: dict[str, str]) -> AsyncIterator[ResponseEvent]:
        seq = 0
        items: list[dict] = []
        open_item: dict | None = None  # the item being streamed: {"kind", "id", "text", ...}
        finish_reason, usage = None, None

        def event(kind: str, **fields: Any) -> ResponseEvent:
            nonlocal seq
            seq += 1
            return ResponseEvent(type=kind, sequence_number=seq - 1, **fields)

        def close() -> list[ResponseEvent]:
            nonlocal open_item
            if open_item is None:
                return []
            item, index, open_item = open_item, len(items), None
            if item["kind"] == "message":
                done = _message_item(item["id"], item["text"])
                part = done["content"][0]
                out = [event("response.output_text.done", item_id=item["id"], output_index=index, content_index=0,
                             text=item["text"], logprobs=[]),
                       event("response.content_part.done", item_id=item["id"], output_index=index, content_index=0,
                             part=part)]
            elif item["kind"] == "reasoning":
                done = _reasoning_item(item["id"], item["text"])
                out = [event("response.reasoning_text.done", item_id=item["id"], output_index=index,
                             content_index=0, text=item["text"])]
            else:
                done = _call_item(item["id"], item["call_id"], item["name"], item["text"], namespaces)
                out = [event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                             name=item["name"], arguments=item["text"])]
            items.append(done)
            return out + [event("response.output_item.done", output_index=index, item=done)]

        def open_(kind: str, **extra: Any) -> list[ResponseEvent]:
            nonlocal open_item
            out = close()
            item_id = _id({"message": "msg", "reasoning": "rs", "function_call": "fc"}[kind])
            open_item = {"kind": kind, "id": item_id, "text": "", **extra}
            index = len(items)
            if kind == "message":
                added = _message_item(item_id, "", "in_progress")
                return out + [event("response.output_item.added", output_index=index, item=added),
                              event("response.content_part.added", item_id=item_id, output_index=index,
                                    content_index=0, part={"type": "output_text", "text": "", "annotations": []})]
            if kind == "reasoning":
                added = _reasoning_item(item_id, None)
            else:
                added = _call_item(item_id, extra["call_id"], extra["name"], "", namespaces, "in_progress")
            return out + [event("response.output_item.added", output_index=index, item=added)]

        def text_delta(kind: str, event_type: str, text: str, **extra: Any) -> list[ResponseEvent]:
            """``text`` added to the open ``kind`` item (opened first if another is open)."""
            out = open_(kind) if open_item is None or open_item["kind"] != kind else []
            open_item["text"] += text
            return out + [event(event_type, item_id=open_item["id"], output_index=len(items), content_index=0,
                                delta=text, **extra)]

        started = shell.model_dump()
        yield event("response.created", response=started)
        yield event("response.in_progress", response=started)
        async for chunk in chunks:
            if isinstance(chunk, ErrorResponse):
                for e in close():
                    yield e
                yield event("error", code=chunk.error.code, message=chunk.error.message, param=chunk.error.param)
                return
            usage = chunk.usage or usage
            for choice in chunk.choices:
                delta = choice.delta
                finish_reason = choice.finish_reason or finish_reason
                if delta.reasoning_content:
                    for e in text_delta("reasoning", "response.reasoning_text.delta", delta.reasoning_content):
                        yield e
                if delta.content:
                    for e in text_delta("message", "response.output_text.delta", delta.content, logprobs=[]):
                        yield e
                for call in delta.tool_calls or []:
                    if call.id:  # a new call: its id and name come first
                        for e in open_("function_call", call_id=call.id, name=call.function.name or ""):
                            yield e
                    elif call.function and call.function.arguments and open_item is not None:
                        open_item["text"] += call.function.arguments
                        yield event("response.function_call_arguments.delta", item_id=open_item["id"],
                                    output_index=len(items), delta=call.function.arguments)
        for e in close():
            yield e
        final = self._finish(shell, items, finish_reason, usage)
        yield event("response.incomplete" if final.status == "incomplete" else "response.completed",
                    response=final.model_dump())
