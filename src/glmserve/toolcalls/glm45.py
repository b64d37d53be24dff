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
text, other values JSON as written (its escapes kept; text that is not JSON is a string): each
value is read by the type its tool's JSON schema gives the key, so ``<arg_value>5</arg_value>``
is the integer 5 for an ``integer`` key and the string "5" for a ``string`` one. Reasoning
(``<think>``) is split off before this parser sees the text (``toolcalls/reasoning.py``).

Streaming (as vLLM's ``glm4_moe`` / ``glm47`` parsers stream them): a call's head (index, name)
goes out once its name is complete and known (at the first ``<arg_key>`` or ``</tool_call>``);
each pair then goes out as a piece of the JSON arguments, ``{"city": `` when its value starts,
a string value's text as it comes (escaped for JSON), any other value whole once it ends, and
``}`` at ``</tool_call>``. An unknown name, or other text after the name, makes the whole call
content, as before. Once the head is out the text is a call: stray text between pairs is
content, held until the call ends (so that no API's stream has to reopen a call's arguments
after text: the stream joins to the whole reply on every API), a key without a value is
dropped, and a call the model leaves open is closed at the end (or, cut by ``max_tokens``, keeps
its unfinished arguments).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from glmserve.toolcalls.base import DeltaEvent, TaggedCallParser, partial_suffix

KEY, KEY_END, VALUE, VALUE_END = "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"
CallState = Literal["name", "refused", "pairs", "key", "value_start", "value"]
# the tags that may end each state of an open call's pairs, besides </tool_call> and <tool_call>
_EXPECTED = {"pairs": (KEY, KEY_END), "key": (KEY_END, VALUE), "value_start": (VALUE, VALUE_END, KEY),
             "value": (VALUE_END, KEY)}


def _is_string_type(schema: dict[str, Any] | None) -> bool:
    kind = (schema or {}).get("type")
    return kind == "string" or (isinstance(kind, list) and bool(kind) and kind[0] == "string")


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


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
        self._inside = ""  # text between the open call's pairs: content once the call ends

    def _piece(self, text: str, out: list[DeltaEvent]) -> None:
        if text:
            out.append(DeltaEvent("tool_call", index=self._index, arguments=text))

    def _advance_call(self, out: list[DeltaEvent]) -> bool:
        while True:
            state = self._state
            if state == "name":
                at, tag = _first(self._buf, KEY, self.end_tag, KEY_END)
                if at < 0:
                    return False
                head = self._buf[:at]
                name, _, extra = head.partition("\n")
                if tag == KEY_END and (split := self._name_and_key(head)):  # the first <arg_key> missing
                    self._open_call(split[0], out)
                    self._key, self._state, self._buf = split[1], "value_start", self._buf[at + len(tag):]
                elif tag != KEY_END and self._known(name.strip()) and not extra.strip():
                    self._open_call(name.strip(), out)
                    self._buf = self._buf[at:]
                elif tag == self.end_tag and self._json_call(head, out):
                    self._buf = self._buf[at + len(tag):]
                    return self._end_call()
                else:
                    self._state = "refused"
            elif state == "refused":  # not a call: content, whole, once it ends (at the next call's start
                end, tag = _first(self._buf, self.end_tag, self.start_tag)  # where its </tool_call> is missing)
                if end < 0:
                    return False
                close = self.end_tag if tag == self.end_tag else ""
                body, self._buf = self._buf[:end], self._buf[end + len(close):]
                self.unread.append(self.start_tag + body + close)
                self._emit_content(self.start_tag + body + close, out)
                return self._end_call()
            else:
                ended = self._advance_pairs(state, out)
                if ended is not None:
                    return ended

    def _advance_pairs(self, state: CallState, out: list[DeltaEvent]) -> bool | None:
        """One step of an open call's pairs: None to go on, else ``_advance_call``'s answer.
        Where the intent is plain, a malformed pair is read as meant (vLLM issue 49248): a
        missing ``</arg_value>`` or ``</arg_key>`` ends at the next tag; a missing ``<arg_key>``
        or ``<arg_value>`` begins after the previous tag; a missing ``</tool_call>`` ends the call
        at the next ``<tool_call>``; a key whose value has no tags takes the text up to the next
        tag. Text between pairs that no tag makes a key or value is content, after the call:
        nothing the model wrote is lost."""
        tags = (*_EXPECTED[state], self.end_tag, self.start_tag)
        at, tag = _first(self._buf, *tags)
        if at < 0:
            if state == "value" and _is_string_type(self._properties.get(self._key)):  # out as it comes
                keep = max(partial_suffix(self._buf, t) for t in tags)
                self._piece(_json_text(self._buf[: len(self._buf) - keep]), out)
                self._buf = self._buf[len(self._buf) - keep:]
            return False  # anything else waits for the tag that says what it is
        text, self._buf = self._buf[:at], self._buf[at + len(tag):]
        if state == "value":
            self._close_value(text, out)
        elif state == "key":
            self._key = text.strip()
        elif state == "pairs" and tag == KEY_END and self._listed(text.strip()):  # <arg_key> missing
            self._key = text.strip()
        elif text.strip() and (state == "pairs" or tag == VALUE):  # text between tags: content, not lost
            self._inside += text + (tag if tag == KEY_END else "")
        if tag == VALUE or (tag == VALUE_END and state == "value_start"):  # (<arg_value> missing)
            self._open_value(out)
            if tag == VALUE_END:
                self._close_value(text, out)
                self._state = "pairs"
            return None
        if state in ("key", "value_start") and tag in (KEY, self.end_tag, self.start_tag):
            # a key without its value tags: the text up to the next tag is its value
            self._open_value(out)
            self._close_value(text.strip() if state == "value_start" else "", out)
        if tag == KEY_END:
            self._state = "value_start" if state == "key" or self._listed(text.strip()) else "pairs"
        elif tag == KEY:
            self._state = "key"
        elif tag == VALUE_END:
            self._state = "pairs"
        else:  # </tool_call>, or a <tool_call> where it is missing: this call ends (the next begins)
            self._piece("}" if self._pairs else "{}", out)
            if tag == self.start_tag:
                self._buf = tag + self._buf
            self._release_inside(out)
            return self._end_call()
        return None

    def _open_call(self, name: str, out: list[DeltaEvent]) -> None:
        self._index, self._n_calls = self._n_calls, self._n_calls + 1
        self._properties = (self.schemas[name] or {}).get("properties") or {}
        self._pairs, self._state = 0, "pairs"
        out.append(DeltaEvent("tool_call", index=self._index, name=name))

    def _name_and_key(self, head: str) -> tuple[str, str] | None:
        """A call's name and its first key written without ``<arg_key>``: ``name\nkey`` or
        ``namekey`` (the longest offered name that ``head`` starts with); None when neither."""
        name, newline, key = head.partition("\n")
        if not newline:
            names = [n for n in self.schemas if head.startswith(n)]
            name = max(names, key=len) if names else ""
            key = head[len(name):]
        name, key = name.strip(), key.strip()
        return (name, key) if self._known(name) and key and self._listed(key, name) else None

    def _listed(self, key: str, name: str | None = None) -> bool:
        """Whether ``key``, read as a key without its ``<arg_key>``, may be one: the tool's
        (``name``, else the open call's) schema lists it among its properties, or lists none.
        Without that evidence the text is prose (``keys end with</arg_key> like that.``)."""
        if not key:
            return False
        properties = (self.schemas[name] or {}).get("properties") if name else self._properties
        return not properties or key in properties

    def _json_call(self, body: str, out: list[DeltaEvent]) -> bool:
        """A call whose arguments are a JSON object after the name (GLM-4-0414's form, written
        inside GLM-4.5's tags): ``name\n{...}`` or ``name{...}``; True when ``body`` is one."""
        brace = body.find("{")
        name = body[:brace].strip() if brace >= 0 else ""
        if not self._known(name):
            return False
        try:
            arguments = json.loads(body[brace:])
        except ValueError:
            return False
        if not isinstance(arguments, dict):
            return False
        self._open_call(name, out)
        self._piece(body[brace:].strip(), out)  # as written: its escapes (a "\ue000") kept
        return True

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
        else:  # JSON as written (its escapes kept), else the text as a string
            self._piece(rest.strip() if _is_json(rest) else json.dumps(rest, ensure_ascii=False), out)

    def _release_inside(self, out: list[DeltaEvent]) -> None:
        inside, self._inside = self._inside, ""
        self._emit_content(inside, out)

    def _end_call(self) -> bool:
        self._in_call, self._state = False, "name"
        return True

    def _finish_call(self, truncated: bool, out: list[DeltaEvent]) -> None:
        name = self._buf.strip()
        if self._state == "name" and not truncated and self._known(name):  # a call without arguments left open
            self._open_call(name, out)
            self._piece("{}", out)
        elif self._state in ("name", "refused"):  # no head sent: content, or dropped when cut off
            super()._finish_call(truncated, out)
        elif not truncated:  # the model left the call open: read it as if it wrote </tool_call>
            self._buf += self.end_tag  # (the buffer holds no whole <tool_call>: feed read those)
            while self._advance_pairs(self._state, out) is None:
                pass
        self._release_inside(out)  # (cut by max_tokens: after the unfinished arguments)
        self._state = "name"


class Glm47Parser(Glm45Parser):
    name = "glm47"
    markers = ("{function-name}<arg_key>",)  # the template's own example call: no newline after the name
