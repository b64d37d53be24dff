"""Tool-call parsers, one per format, registered by name (``glm4``, ``glm45``, ``hermes``, and
``generic`` for models whose template has no tool format)."""

from __future__ import annotations

from glmserve.toolcalls.base import DeltaEvent, ParsedOutput, ToolCallItem, ToolCallParser, assemble
from glmserve.toolcalls.generic import GenericParser
from glmserve.toolcalls.glm4 import Glm4Parser
from glmserve.toolcalls.glm45 import Glm45Parser
from glmserve.toolcalls.hermes import HermesParser

PARSERS: dict[str, type[ToolCallParser]] = {
    p.name: p for p in (Glm45Parser, Glm4Parser, HermesParser, GenericParser)}


def detect_parser(template_source: str | None) -> str:
    """The format a chat template writes calls in, from its markers (GLM-4.5's ``<arg_key>``
    first, then GLM-4's ``<|observation|>``, then hermes' ``<tool_call>``); ``generic`` when
    none matches (the tools are then described to the model by glmserve, ``chat/generic.py``)."""
    for name, parser in PARSERS.items():
        if parser.markers and template_source and all(marker in template_source for marker in parser.markers):
            return name
    return GenericParser.name


__all__ = ["PARSERS", "DeltaEvent", "ParsedOutput", "ToolCallItem", "ToolCallParser", "assemble", "detect_parser"]
