"""``glm45`` and ``glm47``: GLM-4.5 / 4.6 and GLM-4.7 / 5.x calls (sources: the models' chat
templates, llama.cpp ``models/templates/GLM-4.6.jinja`` and GLM-4.7's as vLLM's and SGLang's
``glm47`` parsers quote it; format notes in glmserve's FORMAT.md)::

    GLM-4.5 / 4.6                          GLM-4.7 / 5.x
    <tool_call>get_weather                 <tool_call>get_weather<arg_key>city</arg_key><arg_value>Beijing</arg_value></tool_call>
    <arg_key>city</arg_key>                <tool_call>get_time</tool_call>          (no arguments)
    <arg_value>Beijing</arg_value>
    </tool_call>

Both parsers read both layouts (the name ends at a newline or at the first ``<arg_key>``; pairs
with or without newlines); they differ in how a forced call is constrained (the grammar writes
each model's own layout) and in the template text that identifies them. String values are raw
text, other values JSON: each value is converted by the type its tool's JSON schema gives the
key, so ``<arg_value>5</arg_value>`` is the integer 5 for an ``integer`` key and the string "5"
for a ``string`` one. Reasoning (``<think>``) is split off before this parser sees the text
(``toolcalls/reasoning.py``).

Streaming (as vLLM's ``glm4_moe`` / ``glm47`` parsers stream them): a call's head (index, name)
goes out once its name is complete and known (at the first ``<arg_key>`` or ``</tool_call>``);
each pair then goes out as a piece of the JSON arguments, ``{"city": `` when its value starts,
a string value's text as it comes (escaped for JSON), any other value whole once it ends, and
``}`` at ``</tool_call>``. An unknown name, or other text after the name, makes the whole call
content, as before. Once the head is out the text is a call: stray text between pairs is
skipped, a key without a value is dropped, and a call the model leaves open is closed at the
end (or, cut by ``max_tokens``, keeps its unfinished arguments).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from glmserve.toolcalls.base import DeltaEvent, TaggedCallParser, partial_suffix

KEY, KEY_END, VALUE, VALUE_END = "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"
CallState = Literal["name", "refused", "pairs", "key", "value_start", "value"]


def _is_string_type(schema: dict[str, Any] | None) -> bool:
    kind = (schema or {}).get("type")
    return kind == "string" or (isinstance(kind, list) and bool(kind) and kind[0] == "string")


def convert_value(raw: str, schema: dict[str, Any] | None) -> Any:
    """A raw ``<arg_value>`` as the schema's type: strings as written, anything else as JSON
    (falling back to the raw text when it is not JSON)."""
    if _is_string_type(schema):
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _json_text(text: str) -> str:
    """``text`` escaped as the inside of a JSON string (escaping is per character, so pieces
    escaped one by one join to the whole string escaped)."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


def _first(text: str, *tags: str) -> tuple[int, str]:
    """The earliest of ``tags`` in ``text``: ``(position, tag)``, or ``(-1, "")``."""
    found = [(i, tag) for tag in tags if (i := text.find(tag)) >= 0]
    return min(found) if found else (-1, "")


class Glm45Parser(TaggedCallParser):
    name = "glm45"
    markers = ("<arg_key>",)
    end_of_turn = ("<|observation|>", "<|user|>")
    tags = (*TaggedCallParser.tags, KEY, KEY_END, VALUE, VALUE_END)

    def __init__(self, tools: list[dict[str, Any]] | None = None) -> None:
        super().__init__(tools)
        self._state: CallState = "name"
        self._index = 0  # the open call's
        self._properties: dict[str, Any] = {}
        self._pairs = 0  # pairs of the open call sent so far
        self._key = ""

    def _piece(self, text: str, out: list[DeltaEvent]) -> None:
        if text:
            out.append(DeltaEvent("tool_call", index=self._index, arguments=text))

    def _advance_call(self, out: list[DeltaEvent]) -> bool:
        while True:
            state = self._state
            if state == "name":
                at, _ = _first(self._buf, KEY, self.end_tag)
                if at < 0:
                    return False
                name, _, extra = self._buf[:at].partition("\n")
                name = name.strip()
                if extra.strip() or not self._known(name):
                    self._state = "refused"
                    continue
                self._index, self._n_calls = self._n_calls, self._n_calls + 1
                self._properties = (self.schemas[name] or {}).get("properties") or {}
                self._pairs, self._buf, self._state = 0, self._buf[at:], "pairs"
                out.append(DeltaEvent("tool_call", index=self._index, name=name))
            elif state == "refused":  # not a call: content, whole, once it ends
                end = self._buf.find(self.end_tag)
                if end < 0:
                    return False
                body, self._buf = self._buf[:end], self._buf[end + len(self.end_tag):]
                self._emit_content(self.start_tag + body + self.end_tag, out)
                return self._end_call()
            elif state in ("pairs", "value_start"):
                want = KEY if state == "pairs" else VALUE
                at, tag = _first(self._buf, want, self.end_tag)
                if at < 0:  # stray text is skipped; a partial tag is kept
                    keep = max(partial_suffix(self._buf, want), partial_suffix(self._buf, self.end_tag))
                    self._buf = self._buf[len(self._buf) - keep:]
                    return False
                self._buf = self._buf[at + len(tag):]
                if tag == self.end_tag:
                    self._piece("}" if self._pairs else "{}", out)
                    return self._end_call()
                if state == "pairs":
                    self._state = "key"
                else:
                    self._open_value(out)
            elif state == "key":
                end = self._buf.find(KEY_END)
                if end < 0:
                    return False
                self._key, self._buf, self._state = self._buf[:end].strip(), self._buf[end + len(KEY_END):], "value_start"
            else:  # value
                end = self._buf.find(VALUE_END)
                if end < 0:
                    if _is_string_type(self._properties.get(self._key)):  # its text goes out as it comes
                        keep = partial_suffix(self._buf, VALUE_END)
                        self._piece(_json_text(self._buf[: len(self._buf) - keep]), out)
                        self._buf = self._buf[len(self._buf) - keep:]
                    return False  # any other value waits for its end
                self._close_value(self._buf[:end], out)
                self._buf, self._state = self._buf[end + len(VALUE_END):], "pairs"

    def _open_value(self, out: list[DeltaEvent]) -> None:
        opening = "{" if self._pairs == 0 else ", "
        string = _is_string_type(self._properties.get(self._key))
        self._piece(opening + json.dumps(self._key, ensure_ascii=False) + ": " + ('"' if string else ""), out)
        self._pairs += 1
        self._state = "value"

    def _close_value(self, rest: str, out: list[DeltaEvent]) -> None:
        """The open value's unsent text ``rest``, and its end."""
        schema = self._properties.get(self._key)
        if _is_string_type(schema):
            self._piece(_json_text(rest) + '"', out)
        else:
            self._piece(json.dumps(convert_value(rest, schema), ensure_ascii=False), out)

    def _end_call(self) -> bool:
        self._in_call, self._state = False, "name"
        return True

    def _finish_call(self, truncated: bool, out: list[DeltaEvent]) -> None:
        if self._state in ("name", "refused"):  # no head sent: content, or dropped when cut off
            super()._finish_call(truncated, out)
        elif not truncated:  # the model left the call open: close it
            if self._state == "value":
                self._close_value(self._buf, out)
            self._piece("}" if self._pairs else "{}", out)
        self._state = "name"


class Glm47Parser(Glm45Parser):
    name = "glm47"
    markers = ("{function-name}<arg_key>",)  # the template's own example call: no newline after the name
