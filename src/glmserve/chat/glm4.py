"""OpenAI messages -> GLM-4-9B-Chat template items (FORMAT.md, after the original GLM-4 demo
server's ``process_messages``).

- offered tools become one leading ``system`` item carrying ``tools`` (no content); the caller's
  own system message follows as its own item;
- an assistant message with ``tool_calls`` becomes one assistant item per call, with
  ``metadata`` = function name and ``content`` = the arguments JSON;
- a ``tool`` message becomes an ``observation`` item;
- every other item has empty ``metadata``.
"""

from __future__ import annotations

import json
from typing import Any


def to_glm4_items(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """``messages`` as ``to_template_messages`` returns them; ``tools`` in OpenAI form
    (``{"type": "function", "function": {...}}``) or None when none are offered."""
    items: list[dict[str, Any]] = []
    if tools:
        items.append({"role": "system", "content": None, "tools": tools, "metadata": ""})
    for message in messages:
        role = message["role"]
        if role == "tool":
            items.append({"role": "observation", "content": message["content"], "metadata": ""})
        elif role == "assistant" and message.get("tool_calls"):
            if message.get("content"):
                items.append({"role": "assistant", "content": message["content"], "metadata": ""})
            for call in message["tool_calls"]:
                arguments = call["function"]["arguments"]
                items.append({"role": "assistant", "metadata": call["function"]["name"],
                              "content": arguments if isinstance(arguments, str)
                              else json.dumps(arguments, ensure_ascii=False)})
        else:
            items.append({"role": role, "content": message["content"], "metadata": ""})
    return items
