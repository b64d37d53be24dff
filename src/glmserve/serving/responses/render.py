"""OpenAI's Responses renderer of the reply stream (``serving/generation/reply.py``): the whole
``Response`` (``response``) or its stream events (``ResponseEvents``), from the response's shell
(its request-given fields, ``in_progress``).

Items: the model's reasoning a ``reasoning`` item (its text in ``content`` as
``reasoning_text``, Open Responses' layout; sealed in ``encrypted_content`` where the request
asked, ``Sealer``), a message's text an ``output_text`` part of a ``message`` item, each tool
call a ``function_call`` item (``call_id``: ``call_`` and the reply's call id; a function offered
in a ``namespace`` tool carries its ``namespace``). A reply cut by the token limit is
``status: "incomplete"`` with ``incomplete_details.reason: "max_output_tokens"``, its last message
or call ``incomplete`` too.

Stream events (OpenAI's): ``response.created``, ``response.in_progress``, then per item
(``BlockWriter``: one open at a time) ``response.output_item.added``, its deltas
(``response.output_text.delta`` inside ``response.content_part.added``/``done``,
``response.function_call_arguments.delta``, ``response.reasoning_text.delta``) and ``...done``
events, ``response.output_item.done``, and last ``response.completed`` (or
``response.incomplete``) carrying the whole response; a failure after the start is an ``error``
event. For a caller that only sends the events (``encoded``, the route), a delta of an item
already open comes encoded: its JSON (a ``str``) written from the item's template
(``NumberedJSON``), the event object's JSON.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from glmserve.protocol.errors import APIError
from glmserve.protocol.responses import (
    IncompleteDetails,
    InputTokensDetails,
    OutputTokensDetails,
    Response,
    ResponseEvent,
    ResponseUsage,
)
from glmserve.serving.generation.blocks import BlockWriter
from glmserve.serving.generation.chunks import MARK, NumberedJSON
from glmserve.serving.generation.reply import CallStart, Finish, Reply, TextDelta, Tokens, Whole, prefill_report

Sealer = Callable[[str], str]  # reasoning text -> encrypted_content (ReasoningSeal.seal)
# a block kind -> its item's type, its delta event and that event's fields before and after the delta
_ITEMS = {"content": ("message", "response.output_text.delta", {"content_index": 0}, {"logprobs": []}),
          "reasoning": ("reasoning", "response.reasoning_text.delta", {"content_index": 0}, {}),
          "arguments": ("function_call", "response.function_call_arguments.delta", {}, {})}
_PREFIXES = {"message": "msg", "reasoning": "rs", "function_call": "fc"}


def item_id(kind: str) -> str:
    """A new id for an item of type ``kind`` (``message``, ``reasoning``, ``function_call``)."""
    return f"{_PREFIXES[kind]}_{uuid.uuid4().hex}"


def usage(tokens: Tokens) -> ResponseUsage:
    return ResponseUsage(input_tokens=tokens.prompt,
                         input_tokens_details=InputTokensDetails(cached_tokens=tokens.cached,
                                                                 prefill_start=prefill_report(tokens.prefill)),
                         output_tokens=tokens.completion, output_tokens_details=OutputTokensDetails(),
                         total_tokens=tokens.prompt + tokens.completion)


def message_item(id_: str, text: str, status: str = "completed") -> dict:
    """An assistant ``message`` item: ``in_progress`` (its text to come), ``completed``, or
    ``incomplete`` (cut by ``max_output_tokens``, as OpenAI marks it)."""
    return {"type": "message", "id": id_, "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}] if status != "in_progress" else []}


def call_item(id_: str, call_id: str, name: str, arguments: str, namespaces: dict[str, str],
              status: str = "completed") -> dict:
    """A ``function_call`` item (``call_id``: the reply's, without its prefix)."""
    item = {"type": "function_call", "id": id_, "call_id": f"call_{call_id}", "name": name, "arguments": arguments,
            "status": status}
    if name in namespaces:
        item["namespace"] = namespaces[name]
    return item


def reasoning_item(id_: str, text: str | None, sealed: str | None = None) -> dict:
    return {"type": "reasoning", "id": id_, "summary": [],
            "content": [{"type": "reasoning_text", "text": text}] if text is not None else [],
            "encrypted_content": sealed}


def finished(shell: Response, items: list[dict], finish: Finish, tokens: Tokens) -> Response:
    """``shell`` completed with ``items``: ``incomplete`` when the reply was cut by the token
    limit, its last message or call then ``incomplete`` too."""
    incomplete = finish.reason == "length"
    if incomplete and items and items[-1]["type"] in ("message", "function_call"):
        items = [*items[:-1], {**items[-1], "status": "incomplete"}]
    return shell.model_copy(update={
        "status": "incomplete" if incomplete else "completed", "output": items, "usage": usage(tokens),
        "completed_at": None if incomplete else int(time.time()),
        "incomplete_details": IncompleteDetails(reason="max_output_tokens") if incomplete else None})


def response(shell: Response, whole: Whole, namespaces: dict[str, str], seal: Sealer | None) -> Response:
    """The ``Response`` of ``whole``; ``namespaces``: function name -> its ``namespace`` tool;
    ``seal``: seals reasoning into ``encrypted_content`` (None: not asked for)."""
    choice = whole.choices[0]
    items = []
    if choice.reasoning:
        items.append(reasoning_item(item_id("reasoning"), choice.reasoning, seal(choice.reasoning) if seal else None))
    if choice.content:
        items.append(message_item(item_id("message"), choice.content))
    items += [call_item(item_id("function_call"), c.call_id, c.name, c.arguments, namespaces) for c in choice.calls]
    return finished(shell, items, choice.finish, whole.tokens)


class ResponseEvents(BlockWriter):
    """The Responses stream events of a reply (``events()``): ``ResponseEvent``s, numbered, with
    ``encoded`` some as their JSON (see the module docstring)."""

    def __init__(self, reply: Reply, shell: Response, namespaces: dict[str, str], seal: Sealer | None,
                 encoded: bool) -> None:
        super().__init__(reply)
        self.shell, self.namespaces, self.seal, self.encoded = shell, namespaces, seal, encoded
        self.seq = 0
        self.items: list[dict] = []
        self.item: dict[str, Any] = {}  # the open item: its "id", "pieces" and, for a call, "call"
        self.template: NumberedJSON | None = None  # the open item's delta event, encoded

    def _event(self, kind: str, **fields: Any) -> ResponseEvent:
        self.seq += 1
        return ResponseEvent(type=kind, sequence_number=self.seq - 1, **fields)

    def start(self) -> list[Any]:
        started = self.shell.model_dump()
        return [self._event("response.created", response=started),
                self._event("response.in_progress", response=started)]

    def opened(self, kind: str, call: CallStart | None) -> list[Any]:
        item_type = _ITEMS[kind][0]
        self.item, self.template = {"id": item_id(item_type), "pieces": [], "call": call}, None
        index, id_ = len(self.items), self.item["id"]
        if kind == "content":
            return [self._event("response.output_item.added", output_index=index,
                                item=message_item(id_, "", "in_progress")),
                    self._event("response.content_part.added", item_id=id_, output_index=index, content_index=0,
                                part={"type": "output_text", "text": "", "annotations": []})]
        added = reasoning_item(id_, None) if call is None else \
            call_item(id_, call.call_id, call.name, "", self.namespaces, "in_progress")
        return [self._event("response.output_item.added", output_index=index, item=added)]

    def delta(self, piece: TextDelta, first: bool) -> Any:
        _, event_type, before, after = _ITEMS[piece.kind]
        self.item["pieces"].append(piece.text)
        if not self.encoded or first:
            return self._event(event_type, item_id=self.item["id"], output_index=len(self.items), **before,
                               delta=piece.text, **after)
        if self.template is None:
            self.template = NumberedJSON(ResponseEvent(
                type=event_type, sequence_number=0, item_id=self.item["id"], output_index=len(self.items),
                **before, delta=MARK, **after), "sequence_number")
        self.seq += 1
        return self.template.fill(self.seq - 1, piece.text)

    def closed(self, kind: str, last: bool) -> list[Any]:
        """The open item's done events; the last item of a reply cut by the token limit is
        ``incomplete``."""
        status = "incomplete" if last and self.finish.reason == "length" else "completed"
        id_, index = self.item["id"], len(self.items)
        text = "".join(self.item["pieces"])  # joined once: a += per piece copies the text each time
        if kind == "content":
            done = message_item(id_, text, status)
            out = [self._event("response.output_text.done", item_id=id_, output_index=index, content_index=0,
                               text=text, logprobs=[]),
                   self._event("response.content_part.done", item_id=id_, output_index=index, content_index=0,
                               part=done["content"][0])]
        elif kind == "reasoning":
            done = reasoning_item(id_, text, self.seal(text) if self.seal else None)
            out = [self._event("response.reasoning_text.done", item_id=id_, output_index=index, content_index=0,
                               text=text)]
        else:
            call = self.item["call"]
            done = call_item(id_, call.call_id, call.name, text, self.namespaces, status)
            out = [self._event("response.function_call_arguments.done", item_id=id_, output_index=index,
                               name=call.name, arguments=text)]
        self.items.append(done)
        return out + [self._event("response.output_item.done", output_index=index, item=done)]

    def end(self) -> list[Any]:
        final = finished(self.shell, self.items, self.finish, self.tokens)
        return [self._event("response.incomplete" if final.status == "incomplete" else "response.completed",
                            response=final.model_dump())]

    def error(self, exc: APIError) -> Any:
        error = exc.body().error
        return self._event("error", code=error.code, message=error.message, param=error.param)
