"""``glm45``: GLM-4.5 / 4.6 / 4.7 (source: the models' chat template, llama.cpp
``models/templates/GLM-4.6.jinja``; format notes in glmserve's FORMAT.md)::

    <think>reasoning</think>
    answer text
    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Beijing</arg_value>
    </tool_call>

String values are raw text, other values JSON: each value is converted by the type its tool's
JSON schema gives the key. ``<think>`` text becomes ``reasoning_content``.
"""

from __future__ import annotations

import json
import re
from typing import Any

from glmserve.toolcalls.base import DeltaEvent, TaggedCallParser, _TextStream, partial_suffix

_PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)
THINK_START, THINK_END = "<think>", "</think>"


def _is_string_type(schema: dict[str, Any]) -> bool:
    kind = schema.get("type")
    return kind == "string" or (isinstance(kind, list) and kind and kind[0] == "string")


def convert_value(raw: str, schema: dict[str, Any] | None) -> Any:
    """A raw ``<arg_value>`` as the schema's type: strings as written, anything else as JSON
    (falling back to the raw text when it is not JSON)."""
    if schema and _is_string_type(schema):
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw


class Glm45Parser(TaggedCallParser):
    name = "glm45"
    markers = ("<arg_key>",)
    end_of_turn = ("<|observation|>", "<|user|>")
    always_active = True

    def __init__(self, tools: list[dict[str, Any]] | None = None) -> None:
        super().__init__(tools)
        self._phase = "start"  # start -> think -> body
        self._head = ""
        self._reasoning = _TextStream("reasoning")

    def decode(self, body: str) -> tuple[str, dict] | None:
        name, _, rest = body.partition("\n") if "<arg_key>" not in body.split("\n", 1)[0] else (
            body[: body.index("<arg_key>")], "", body[body.index("<arg_key>"):])
        name = name.strip()
        if not self._known(name):
            return None
        properties = (self.schemas[name] or {}).get("properties", {})
        pairs = _PAIR.findall(rest)
        if _PAIR.sub("", rest).strip():  # text that is not a key/value pair: malformed
            return None
        return name, {k.strip(): convert_value(v, properties.get(k.strip())) for k, v in pairs}

    def feed(self, text: str) -> list[DeltaEvent]:
        out: list[DeltaEvent] = []
        if self._phase == "body":
            return super().feed(text)
        self._head += text
        if self._phase == "start":
            stripped = self._head.lstrip()
            if THINK_START.startswith(stripped):  # could still become "<think>"
                return out
            if stripped.startswith(THINK_START):
                self._phase, self._head = "think", stripped[len(THINK_START):]
            else:
                self._phase, rest, self._head = "body", self._head, ""
                return super().feed(rest)
        end = self._head.find(THINK_END)
        if end >= 0:
            self._reasoning.add(self._head[:end], out)
            rest, self._head, self._phase = self._head[end + len(THINK_END):], "", "body"
            return out + super().feed(rest)
        keep = partial_suffix(self._head, THINK_END)
        self._reasoning.add(self._head[: len(self._head) - keep], out)
        self._head = self._head[len(self._head) - keep:]
        return out

    def finish(self, truncated: bool = False) -> list[DeltaEvent]:
        out: list[DeltaEvent] = []
        if self._phase == "think":  # reasoning cut off (max_tokens): it stays reasoning
            self._reasoning.add(self._head, out)
        elif self._phase == "start":
            self._emit_content(self._head, out)
        self._head = ""
        return out + super().finish(truncated)
