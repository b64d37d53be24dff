"""Hosted tools: the tools OpenAI's and Anthropic's own servers run for the model (web search,
file search, code interpreter, computer use, image generation, remote MCP; Anthropic's web
search, web fetch and code execution server tools). Nothing here can run them, and coding agents
offer some in every request (Codex CLI: ``web_search``), so one rule serves both APIs: a request
that merely offers them is served without them (logged once per request), and one whose
``tool_choice`` forces one is a 400 naming it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from glmserve.protocol.errors import invalid_request

log = logging.getLogger(__name__)

# OpenAI Responses tool types (API reference, "Tools"), dated variants included by prefix
OPENAI_HOSTED = ("web_search", "file_search", "code_interpreter", "computer", "image_generation", "mcp")
# Anthropic server tools (Messages API, "Server tools"): web_search_20250305, web_fetch_20250910...
ANTHROPIC_HOSTED = ("web_search_", "web_fetch_", "code_execution_")


def is_hosted(kind: Any, prefixes: tuple[str, ...]) -> bool:
    """Whether a tool ``type`` is one of ``prefixes`` (itself, or a dated or suffixed variant)."""
    return isinstance(kind, str) and any(kind == p or kind.startswith(p if p.endswith("_") else p + "_")
                                         for p in prefixes)


def leave_out(tools: list[dict[str, Any]], prefixes: tuple[str, ...], forced: Callable[[dict[str, Any]], bool],
              api: str) -> list[tuple[int, dict[str, Any]]]:
    """``tools`` (with their indexes) less the hosted ones, which are logged as left out.
    ``forced(tool)``: whether the request's ``tool_choice`` names that hosted tool. Raises a
    400 naming ``tool_choice`` when it forces one."""
    kept, dropped = [], []
    for i, tool in enumerate(tools):
        kind = tool.get("type")
        if not is_hosted(kind, prefixes):
            kept.append((i, tool))
            continue
        if forced(tool):
            raise invalid_request(f"tool_choice forces the hosted tool {kind!r}, which this server cannot run "
                                  "(hosted tools are left out of requests)", "tool_choice")
        dropped.append(kind)
    if dropped:
        log.info("%s request: hosted tools left out (nothing here runs them): %s", api, ", ".join(dropped))
    return kept
