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
"""

from __future__ import annotations

import json
import re
from typing import Any

from glmserve.toolcalls.base import TaggedCallParser

_PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


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

    def decode(self, body: str) -> tuple[str, dict] | None:
        first = body.find("<arg_key>")
        head = body if first < 0 else body[:first]
        name, _, extra = head.partition("\n")
        name = name.strip()
        if extra.strip() or not self._known(name):
            return None
        rest = "" if first < 0 else body[first:]
        properties = (self.schemas[name] or {}).get("properties", {})
        pairs = _PAIR.findall(rest)
        if _PAIR.sub("", rest).strip():  # text that is not a key/value pair: malformed
            return None
        return name, {k.strip(): convert_value(v, properties.get(k.strip())) for k, v in pairs}


class Glm47Parser(Glm45Parser):
    name = "glm47"
    markers = ("{function-name}<arg_key>",)  # the template's own example call: no newline after the name
