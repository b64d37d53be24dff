"""``hermes``: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, as Hermes, Qwen2.5,
SmolLM3 and many other chat templates write calls (source: the Hermes function-calling format,
and vLLM's ``hermes_tool_parser.py``)."""

from __future__ import annotations

import json

from glmserve.toolcalls.base import TaggedCallParser


class HermesParser(TaggedCallParser):
    name = "hermes"
    markers = ("<tool_call>",)

    def decode(self, body: str) -> tuple[str, dict] | None:
        try:
            call = json.loads(body)
        except ValueError:
            return None
        if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not self._known(call["name"]):
            return None
        arguments = call.get("arguments", call.get("parameters", {}))
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                return None
        if not isinstance(arguments, dict):
            return None
        return call["name"], arguments
