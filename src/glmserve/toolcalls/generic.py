"""``generic``: tool calls for models whose chat template knows nothing of tools.

The model is told (``chat/generic.py``) to answer either in plain text or with one JSON object
and nothing else::

    {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}, ...]}

This is llama.cpp's generic tool-call format (``common/chat.cpp``,
``common_chat_params_init_generic``), with plain text instead of its ``{"response": ...}``
wrapper so that answers stream as they are written. Decoding is constrained to it
(``serving/structured/grammar.py``), so a reply that starts with ``{`` is a call.

Streaming: text is released at once when the reply cannot start with ``{"tool_calls": [``;
each call is emitted as soon as its object is complete. A reply cut by ``max_tokens`` inside a
call loses that unfinished call (never leaked into ``content``); the complete calls before it
are kept.
"""

from __future__ import annotations

import json
import re
from typing import Any

from glmserve.toolcalls.base import DeltaEvent, HeadDecidedParser

OPENING = '{"tool_calls": ['
_OPENING = re.compile(r'\{\s*"tool_calls"\s*:\s*\[')
_COMPACT_OPENING = re.sub(r"\s", "", OPENING)
_DECODER = json.JSONDecoder()


class GenericParser(HeadDecidedParser):
    name = "generic"
    markers = ()  # never detected from a template: the fallback when no other format is

    def __init__(self, tools: list[dict[str, Any]] | None = None) -> None:
        super().__init__(tools)
        self._pos = 0  # call mode: where the next array element (or the closing ']') begins
        self._closed = False  # call mode: the array's ']' was seen

    def _advance(self, out: list[DeltaEvent]) -> None:
        if self._mode == "head":
            self._decide_head(out)
        if self._mode == "call" and not self._closed:
            self._take_calls(out)

    def _decide_head(self, out: list[DeltaEvent]) -> None:
        head = self._buf.lstrip()
        compact = re.sub(r"\s", "", head[:64])
        if len(compact) < len(_COMPACT_OPENING) and _COMPACT_OPENING.startswith(compact):
            return  # could still become the opening (or is only whitespace so far)
        match = _OPENING.match(head)
        if match:
            self._mode, self._buf, self._pos = "call", head, match.end()
        else:
            self._to_content(out)

    def _take_calls(self, out: list[DeltaEvent]) -> None:
        """Decode every complete element of the ``tool_calls`` array after ``_pos``."""
        buf = self._buf
        while True:
            pos = self._pos
            while pos < len(buf) and buf[pos] in " \t\r\n,":
                pos += 1
            self._pos = pos
            if pos >= len(buf):
                return
            if buf[pos] == "]":
                self._closed, self._pos = True, pos + 1
                return
            if buf.rfind("}", pos) < 0:  # no element can be complete yet
                return
            try:
                element, end = _DECODER.raw_decode(buf, pos)
            except ValueError:
                return
            decoded = self._decode(element)
            if decoded is None:
                self._emit_content(buf[pos:end], out)
            else:
                self._emit_call(*decoded, out)
            self._pos = end

    def _decode(self, element: Any) -> tuple[str, dict] | None:
        if not isinstance(element, dict) or not isinstance(element.get("name"), str):
            return None
        if not self._known(element["name"]):
            return None
        arguments = element.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                return None
        return (element["name"], arguments) if isinstance(arguments, dict) else None

    def finish(self, truncated: bool = False) -> list[DeltaEvent]:
        out: list[DeltaEvent] = []
        if self._mode == "head":
            self._emit_content(self._buf, out)
        elif self._mode == "call":
            if self._closed:
                rest = self._buf[self._pos:].strip()
                self._emit_content(rest[1:] if rest.startswith("}") else rest, out)
            elif not truncated:  # the turn ended inside the array: what is left is text
                self._emit_content(self._buf if self._n_calls == 0 else self._buf[self._pos:], out)
        self._buf, self._mode = "", "head"
        return out
