"""Prompt normalization (``--prompt-normalize``): what a client sends that changes per request
or per session and means nothing to the model, removed from the template messages before the
prompt is rendered, so that the prefix caches (a slot's cached prefix, the host prompt cache)
serve a new session's shared system-and-tools prefix. Nothing the model would read differently
is touched: a rule removes only its own exact pattern.

Rules, by name (``--prompt-normalize`` names those in force; all of them by default, ``none``
for none):

- ``claude-code-attribution``: Claude Code's attribution line, the first line of the first
  system message: ``x-anthropic-billing-header: cc_version=<version>.<3 hex>;
  cc_entrypoint=<name>;`` with more ``key=value;`` fields in some versions (``cc_is_subagent=
  true;`` in sub-agents, ``cch=<hex>;``). Claude Code 2.1.x sends it as the first system block
  (the Messages API; claude-code-router and other proxies pass it on as the first line of a chat
  completions system message), and its suffix follows the conversation's first user message
  (``2.1.197.ce1`` for one question, ``2.1.197.73f`` for the next session's), so a prompt that
  kept it would differ from its first token. ``CLAUDE_CODE_ATTRIBUTION_HEADER=0`` turns it off
  on the client. The line is removed with its line break; a system message left empty is
  dropped.

What a rule removes is logged at debug (``glmserve.prompt``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable
from typing import Any

log = logging.getLogger("glmserve.prompt")

_ATTRIBUTION = re.compile(r"x-anthropic-billing-header:(?: [a-z_]+=[^;\n]*;)+[ \t]*(?:\r?\n|$)")


def _first_line_of_first_system(messages: list[dict[str, Any]],
                                 pattern: re.Pattern) -> tuple[list[dict[str, Any]], str]:
    """``messages`` without ``pattern`` matched at the start of the first message's text when it
    is a system message (a string, or its first text part), and what was removed ("": nothing)."""
    if not messages or messages[0].get("role") != "system":
        return messages, ""
    first, content = messages[0], messages[0].get("content")
    if isinstance(content, str):
        match = pattern.match(content)
        if match is None:
            return messages, ""
        rest: Any = content[match.end():]
    elif isinstance(content, list) and content and isinstance(content[0], dict) and content[0].get("type") == "text":
        match = pattern.match(content[0].get("text") or "")
        if match is None:
            return messages, ""
        text = content[0]["text"][match.end():]
        rest = ([{**content[0], "text": text}] if text else []) + content[1:]
    else:
        return messages, ""
    kept = [] if not rest and "tool_calls" not in first else [{**first, "content": rest}]
    return kept + messages[1:], match.group(0)


RULES: dict[str, Callable[[list[dict[str, Any]]], tuple[list[dict[str, Any]], str]]] = {
    "claude-code-attribution": lambda messages: _first_line_of_first_system(messages, _ATTRIBUTION),
}
NONE = "none"


class PromptNormalizer:
    """The rules ``names`` names (``RULES``; ``none`` alone: no rule), applied in ``RULES``'
    order. Raises ``ValueError`` for an unknown name."""

    def __init__(self, names: Iterable[str] = tuple(RULES)) -> None:
        names = tuple(names)
        unknown = sorted(set(names) - set(RULES) - {NONE})
        if unknown or (NONE in names and len(names) > 1):
            raise ValueError(f"--prompt-normalize takes {NONE} alone or rules of: {', '.join(RULES)} "
                             f"(not {', '.join(unknown) or 'none with a rule'})")
        self.names = tuple(name for name in RULES if name in names)

    def __call__(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``messages`` (template-ready dicts) with what the rules remove removed; the same list
        when nothing is."""
        for name in self.names:
            messages, removed = RULES[name](messages)
            if removed:
                log.debug("prompt normalized (%s): removed %r from the first system message", name, removed)
        return messages
