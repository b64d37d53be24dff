"""``/v1/responses`` (OpenAI's Responses API), stateless, on top of the chat handler: the
request's ``input`` items become chat messages (``serving/responses/request.py``), the chat
completion (or its chunks) becomes the ``response`` object (or its typed events). Storing,
``previous_response_id`` and background runs are ``serving/responses/stored.py``'s: it hands
this service the whole input and keeps what comes back.

Items: a message's text becomes an ``output_text`` part of a ``message`` item; each tool call
a ``function_call`` item (``call_id`` = the chat tool call's id); the model's reasoning a
``reasoning`` item before them (its text in ``content`` as ``reasoning_text``, Open Responses'
layout; with ``include: ["reasoning.encrypted_content"]`` also sealed in ``encrypted_content``,
``serving/responses/sealed_reasoning.py``). Reasoning items sent back in ``input`` are replayed to the
template as the turn's ``reasoning_content``, and past reasoning is kept in the prompt
(``PRESERVED_THINKING``). A reply cut by ``max_output_tokens`` is ``status: "incomplete"`` with
``incomplete_details.reason: "max_output_tokens"``. ``truncation: "auto"`` drops the oldest
turns (whole: from one user message to the next) until the prompt fits the context; the
instructions and system/developer messages before the first turn stay.

Stream events (OpenAI's): ``response.created``, ``response.in_progress``, then per item
``response.output_item.added``, its deltas (``response.output_text.delta`` inside
``response.content_part.added``/``done``, ``response.function_call_arguments.delta``,
``response.reasoning_text.delta``) and ``...done`` events, ``response.output_item.done``, and
last ``response.completed`` (or ``response.incomplete``) carrying the whole response; a failure
after the start is an ``error`` event. The stream reads the chat stream's pieces of text as
``TextDelta``s (no chunk objects built for them); for a caller that only sends the events
(``create(encoded=True)``, the route), a delta of the open item comes already encoded: its JSON
(a ``str``) written from the item's template (``NumberedJSON``), the event object's JSON.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from glmserve.engine.types import INTERACTIVE_PRIORITY
from glmserve.protocol.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionRequest, StreamOptions, Usage
from glmserve.protocol.errors import ErrorResponse, invalid_request
from glmserve.protocol.responses import (
    INCLUDABLE,
    IncompleteDetails,
    InputTokensDetails,
    OutputTokensDetails,
    Response,
    ResponseEvent,
    ResponsesRequest,
    ResponseUsage,
)
from glmserve.serving.chat.service import ChatService
from glmserve.serving.generation.pipeline import ModelPipeline
from glmserve.serving.generation.chunks import MARK, ChunkStream, ChunkWalk, NumberedJSON, TextDelta
from glmserve.serving.responses.request import function_tools, to_chat_request
from glmserve.serving.generation.sampling import with_defaults
from glmserve.serving.responses.sealed_reasoning import ReasoningSeal
from glmserve.serving.generation.template_vars import PRESERVED_THINKING, with_template_defaults


Sealer = Callable[[str], str]  # reasoning text -> encrypted_content (ReasoningSeal.seal)
# a TextDelta's kind -> the item it goes to, its delta event and that event's fields beside the delta
_PIECES = {"content": ("message", "response.output_text.delta", {"content_index": 0}),
           "reasoning": ("reasoning", "response.reasoning_text.delta", {"content_index": 0}),
           "arguments": ("function_call", "response.function_call_arguments.delta", {})}


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _usage(usage: Usage | None) -> ResponseUsage | None:
    if usage is None:
        return None
    cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0
    return ResponseUsage(input_tokens=usage.prompt_tokens,
                         input_tokens_details=InputTokensDetails(cached_tokens=cached),
                         output_tokens=usage.completion_tokens, output_tokens_details=OutputTokensDetails(),
                         total_tokens=usage.total_tokens)


def _message_item(item_id: str, text: str, status: str = "completed") -> dict:
    """An assistant ``message`` item: ``in_progress`` (its text to come), ``completed``, or
    ``incomplete`` (cut by ``max_output_tokens``, as OpenAI marks it)."""
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}] if status != "in_progress" else []}


def _call_item(item_id: str, call_id: str, name: str, arguments: str, namespaces: dict[str, str],
               status: str = "completed") -> dict:
    """A ``function_call`` item; a function offered inside a ``namespace`` tool carries its
    ``namespace``, as OpenAI returns a namespaced call."""
    item = {"type": "function_call", "id": item_id, "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}
    if name in namespaces:
        item["namespace"] = namespaces[name]
    return item


def _reasoning_item(item_id: str, text: str | None, sealed: str | None = None) -> dict:
    return {"type": "reasoning", "id": item_id, "summary": [],
            "content": [{"type": "reasoning_text", "text": text}] if text is not None else [],
            "encrypted_content": sealed}


def _checked(req: ResponsesRequest, seal: ReasoningSeal | None) -> None:
    """400s for what this server does not do: ``include`` values other than ``INCLUDABLE``,
    logprobs."""
    for i, value in enumerate(req.include or []):
        if value not in INCLUDABLE:
            raise invalid_request(f"include {value!r} is not served here (one of {', '.join(sorted(INCLUDABLE))})",
                                  f"include.{i}")
    if "reasoning.encrypted_content" in (req.include or []) and seal is None:
        raise invalid_request("this server has no key to seal reasoning with", "include")
    if req.top_logprobs:
        raise invalid_request("logprobs are not returned on /v1/responses here (chat completions returns them)",
                              "top_logprobs")


def _turn_starts(roles: list[str]) -> tuple[int, list[int]]:
    """``(lead, starts)``: how many system/developer messages lead the conversation, and the
    indices ``truncation: "auto"`` may cut it at (each user message after the first turn)."""
    lead = next((i for i, role in enumerate(roles) if role not in ("system", "developer")), len(roles))
    return lead, [i for i in range(lead + 1, len(roles)) if roles[i] == "user"]


class ResponsesService:
    """Serve ``/v1/responses`` over a ``ChatService``. ``create(req)`` returns a ``Response``
    or, for ``stream=True``, an async iterator of ``ResponseEvent``s. Client errors raise
    ``APIError`` before anything is generated. ``seal`` seals and opens reasoning's
    ``encrypted_content`` (None: asking for it is a 400)."""

    def __init__(self, model: ModelPipeline, chat: ChatService, seal: ReasoningSeal | None = None) -> None:
        self.model, self.chat = model, chat
        self.seal = seal

    def _open(self, token: str, param: str) -> str:
        if self.seal is None:
            raise invalid_request("this server has no key to open encrypted_content with", param)
        return self.seal.open(token, param)

    async def create(self, req: ResponsesRequest, priority: int = INTERACTIVE_PRIORITY,
                     encoded: bool = False) -> Response | AsyncIterator[ResponseEvent | ErrorResponse | str]:
        """The response, or for ``stream`` its events (``encoded``: some as their JSON, see the
        module docstring). Raises ``APIError`` before anything is generated."""
        _checked(req, self.seal)
        tools, namespaces = function_tools(req)
        chat_req = with_template_defaults(to_chat_request(req, tools, self._open), PRESERVED_THINKING,
                                          self.model.default_template_kwargs)
        if req.truncation == "auto":
            chat_req = await asyncio.to_thread(self._truncated, chat_req)
        seal = self.seal.seal if "reasoning.encrypted_content" in (req.include or []) else None
        used, _ = with_defaults(chat_req, self.model.generation_defaults)  # the sampling generation uses
        shell = Response(id=_id("resp"), created_at=int(time.time()), status="in_progress", model=req.model,
                         instructions=req.instructions, tools=req.tools or [],
                         tool_choice=req.tool_choice if req.tool_choice is not None else "auto",
                         truncation=req.truncation or "disabled",
                         parallel_tool_calls=req.parallel_tool_calls is not False,
                         temperature=1.0 if used.temperature is None else used.temperature,
                         top_p=1.0 if used.top_p is None else used.top_p,
                         presence_penalty=used.presence_penalty, frequency_penalty=used.frequency_penalty,
                         reasoning=req.reasoning.model_dump(exclude_none=True) if req.reasoning else None,
                         max_output_tokens=req.max_output_tokens, max_tool_calls=req.max_tool_calls,
                         metadata=req.metadata or {}, user=req.user, store=bool(req.store),
                         background=bool(req.background), previous_response_id=req.previous_response_id,
                         conversation={"id": req.conversation} if req.conversation else None,
                         safety_identifier=req.safety_identifier,
                         prompt_cache_key=req.prompt_cache_key,
                         text=req.text.model_dump(by_alias=True, exclude_none=True) if req.text else {
                             "format": {"type": "text"}})
        if not req.stream:
            completion = await self.chat.create(chat_req, priority=priority)
            return self._finish(shell, self._items(completion, namespaces, seal),
                                completion.choices[0].finish_reason, completion.usage)
        stream_req = chat_req.model_copy(update={"stream": True, "stream_options": StreamOptions(include_usage=True)})
        chunks = await self.chat.create(stream_req, priority=priority, text_form="delta")
        return ChunkStream(self._events(shell, chunks, namespaces, seal, encoded), chunks)

    def _truncated(self, req: ChatCompletionRequest) -> ChatCompletionRequest:
        """``req`` without its oldest turns, as few as make the prompt fit the context with room
        for ``max_tokens`` (one token when unset); unchanged when it fits, or when even its last
        turn alone does not (the chat handler's 400 says so)."""
        room = self.model.context_length - (req.max_completion_tokens or req.max_tokens or 1)
        messages = req.messages
        lead, starts = _turn_starts([m.role for m in messages])

        def cut(at: int) -> ChatCompletionRequest:
            return req.model_copy(update={"messages": messages[:lead] + messages[at:]})

        def fits(r: ChatCompletionRequest) -> bool:
            return len(self.model.prompt_token_ids(r)) <= room

        if not starts or fits(req):
            return req
        lo, hi = 0, len(starts) - 1  # the first cut that fits, if the last does
        if not fits(cut(starts[hi])):
            return req
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if fits(cut(starts[mid])) else (mid + 1, hi)
        return cut(starts[lo])

    @staticmethod
    def _items(completion: ChatCompletion, namespaces: dict[str, str], seal: Sealer | None) -> list[dict]:
        message = completion.choices[0].message
        items = []
        if message.reasoning_content:
            items.append(_reasoning_item(_id("rs"), message.reasoning_content,
                                         seal(message.reasoning_content) if seal else None))
        if message.content:
            items.append(_message_item(_id("msg"), message.content))
        items += [_call_item(_id("fc"), c.id, c.function.name, c.function.arguments, namespaces)
                  for c in message.tool_calls or []]
        return items

    @staticmethod
    def _finish(shell: Response, items: list[dict], finish_reason: str | None, usage: Usage | None) -> Response:
        """The response of ``items``: ``incomplete`` when the reply was cut by the token limit,
        its last message or call then ``incomplete`` too."""
        incomplete = finish_reason == "length"
        if incomplete and items and items[-1]["type"] in ("message", "function_call"):
            items = [*items[:-1], {**items[-1], "status": "incomplete"}]
        return shell.model_copy(update={
            "status": "incomplete" if incomplete else "completed", "output": items, "usage": _usage(usage),
            "completed_at": None if incomplete else int(time.time()),
            "incomplete_details": IncompleteDetails(reason="max_output_tokens") if incomplete else None})

    async def _events(self, shell: Response, chunks: AsyncIterator[ChatCompletionChunk | ErrorResponse | TextDelta],
                      namespaces: dict[str, str], seal: Sealer | None,
                      encoded: bool = False) -> AsyncIterator[ResponseEvent | str]:
        seq = 0
        items: list[dict] = []
        open_item: dict | None = None  # the item being streamed: {"kind", "id", "pieces", ...}
        walk = ChunkWalk()
        template: NumberedJSON | None = None  # the open item's delta event, encoded

        def event(kind: str, **fields: Any) -> ResponseEvent:
            nonlocal seq
            seq += 1
            return ResponseEvent(type=kind, sequence_number=seq - 1, **fields)

        def close(status: str = "completed") -> list[ResponseEvent]:
            """The open item's done events; ``status``: ``incomplete`` for the last one of a
            reply cut by the token limit."""
            nonlocal open_item
            if open_item is None:
                return []
            item, index, open_item = open_item, len(items), None
            item["text"] = "".join(item.pop("pieces"))  # joined once: a += per piece copies the text each time
            if item["kind"] == "message":
                done = _message_item(item["id"], item["text"], status)
                part = done["content"][0]
                out = [event("response.output_text.done", item_id=item["id"], output_index=index, content_index=0,
                             text=item["text"], logprobs=[]),
                       event("response.content_part.done", item_id=item["id"], output_index=index, content_index=0,
                             part=part)]
            elif item["kind"] == "reasoning":
                done = _reasoning_item(item["id"], item["text"], seal(item["text"]) if seal else None)
                out = [event("response.reasoning_text.done", item_id=item["id"], output_index=index,
                             content_index=0, text=item["text"])]
            else:
                done = _call_item(item["id"], item["call_id"], item["name"], item["text"], namespaces, status)
                out = [event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                             name=item["name"], arguments=item["text"])]
            items.append(done)
            return out + [event("response.output_item.done", output_index=index, item=done)]

        def open_(kind: str, **extra: Any) -> list[ResponseEvent]:
            nonlocal open_item, template
            out = close()
            item_id = _id({"message": "msg", "reasoning": "rs", "function_call": "fc"}[kind])
            open_item = {"kind": kind, "id": item_id, "pieces": [], **extra}
            template = None
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

        def piece(p: TextDelta) -> list[ResponseEvent | str]:
            """``p`` added to the open item of its kind (a text item is opened first if another is
            open; a call's arguments go to the open call, opened by its head, and are dropped
            when no call is open)."""
            nonlocal seq, template
            kind, event_type, fields = _PIECES[p.kind]
            out = []
            if kind == "function_call":
                if open_item is None or open_item["kind"] != kind:
                    return []
            elif open_item is None or open_item["kind"] != kind:
                out = open_(kind)
            open_item["pieces"].append(p.text)
            extra = {"logprobs": []} if kind == "message" else {}
            if out or not encoded:
                return out + [event(event_type, item_id=open_item["id"], output_index=len(items), **fields,
                                    delta=p.text, **extra)]
            if template is None:
                template = NumberedJSON(ResponseEvent(
                    type=event_type, sequence_number=0, item_id=open_item["id"], output_index=len(items), **fields,
                    delta=MARK, **extra), "sequence_number")
            seq += 1
            return [template.fill(seq - 1, p.text)]

        started = shell.model_dump()
        yield event("response.created", response=started)
        yield event("response.in_progress", response=started)
        async for chunk in chunks:
            if type(chunk) is TextDelta:  # the usual token
                for e in piece(chunk):
                    yield e
                continue
            if isinstance(chunk, ErrorResponse):
                for e in close():
                    yield e
                yield event("error", code=chunk.error.code, message=chunk.error.message, param=chunk.error.param)
                return
            for p in walk.pieces(chunk):
                events = piece(p) if type(p) is TextDelta else open_("function_call", call_id=p.call_id, name=p.name)
                for e in events:
                    yield e
        for e in close("incomplete" if walk.finish_reason == "length" else "completed"):
            yield e
        final = self._finish(shell, items, walk.finish_reason, walk.usage)
        yield event("response.incomplete" if final.status == "incomplete" else "response.completed",
                    response=final.model_dump())
