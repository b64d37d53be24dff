"""OpenAI messages with tools -> plain chat messages, for templates that know nothing of tools
(the ``generic`` tool-call format, ``toolcalls/generic.py``).

After llama.cpp's generic handler and minja's polyfills (``common/chat.cpp``,
``minja/chat-template.hpp``), in a form any template renders:

- the offered tools, the call syntax and what ``tool_choice`` asks for go into a system
  message (appended to the caller's first system message, or a new one at the start);
- an assistant message with ``tool_calls`` becomes its text followed by the
  ``{"tool_calls": [...]}`` object the model is asked to write;
- ``tool`` messages become one ``user`` message per run of results, one
  ``{"tool_response": {"name": ..., "content": ...}}`` line each (templates often refuse a
  ``tool`` role or two user turns in a row).
"""

from __future__ import annotations

import json
from typing import Any

_SYNTAX = '{"tool_calls": [{"name": "<function name>", "arguments": {<arguments as JSON>}}]}'


def tools_system_prompt(functions: list[dict[str, Any]], choice: str) -> str:
    """The instructions for ``functions`` (OpenAI function objects) under ``choice``
    (``auto``, ``required`` or a function name)."""
    listing = "\n".join(json.dumps(f, ensure_ascii=False) for f in functions)
    if choice == "auto":
        ask = ("To call one or more tools, reply with only this JSON object and nothing else:\n"
               f"{_SYNTAX}\nOtherwise, answer in plain text.")
    elif choice == "required":
        ask = f"You must call one or more tools now. Reply with only this JSON object:\n{_SYNTAX}"
    else:
        ask = f"You must call the tool {choice!r} now. Reply with only this JSON object:\n{_SYNTAX}"
    return (f"You have access to these tools (JSON Schema of each function's arguments):\n{listing}\n\n{ask}\n"
            'Tool results come back as {"tool_response": {"name": ..., "content": ...}}.')


def _call_text(message: dict[str, Any]) -> str:
    calls = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in message["tool_calls"]]
    text = json.dumps({"tool_calls": calls}, ensure_ascii=False)
    return f"{message['content']}\n\n{text}" if message.get("content") else text


def to_generic_messages(messages: list[dict[str, Any]], functions: list[dict[str, Any]] | None,
                        choice: str) -> list[dict[str, Any]]:
    """``messages`` as ``to_template_messages`` returns them, rewritten as the module docstring
    says; ``functions``: the offered function objects (None: no tools offered, only the history
    is rewritten)."""
    names = {c["id"]: c["function"]["name"] for m in messages for c in m.get("tool_calls") or [] if c.get("id")}
    out: list[dict[str, Any]] = []
    for message in messages:
        if message["role"] == "tool":
            name = names.get(message.get("tool_call_id"), message.get("name", ""))
            line = json.dumps({"tool_response": {"name": name, "content": message["content"]}}, ensure_ascii=False)
            if out and out[-1].get("_tool_results"):
                out[-1]["content"] += "\n" + line
            else:
                out.append({"role": "user", "content": line, "_tool_results": True})
        elif message["role"] == "assistant" and message.get("tool_calls"):
            out.append({"role": "assistant", "content": _call_text(message)})
        else:
            out.append(dict(message))
    for item in out:
        item.pop("_tool_results", None)
    if functions:
        prompt = tools_system_prompt(functions, choice)
        if out and out[0]["role"] == "system" and isinstance(out[0]["content"], str):
            out[0]["content"] = f"{out[0]['content']}\n\n{prompt}" if out[0]["content"] else prompt
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out
