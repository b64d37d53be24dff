"""Tool-call parsers, one per format, registered by name (``glm4``, ``glm45``, ``glm47``,
``hermes``, and ``generic`` for models whose template has no tool format), and the reasoning
parser that splits ``<think>`` text off before them (``reasoning.py``)."""

from __future__ import annotations

from typing import Any

from glmserve.toolcalls.base import DeltaEvent, ParsedOutput, ToolCallItem, ToolCallParser, assemble
from glmserve.toolcalls.generic import GenericParser
from glmserve.toolcalls.glm4 import Glm4Parser
from glmserve.toolcalls.glm45 import Glm45Parser, Glm47Parser
from glmserve.toolcalls.hermes import HermesParser
from glmserve.toolcalls.reasoning import THINK_END, THINK_START, ReasoningParser, has_reasoning, prompt_state

PARSERS: dict[str, type[ToolCallParser]] = {
    p.name: p for p in (Glm47Parser, Glm45Parser, Glm4Parser, HermesParser, GenericParser)}


def detect_parser(template_source: str | None) -> str:
    """The format a chat template writes calls in, from its markers (GLM-4.7's example call with
    the name right before ``<arg_key>`` first, then GLM-4.5's ``<arg_key>``, then GLM-4's ``<|observation|>``, then hermes' ``<tool_call>``); ``generic`` when
    none matches (the tools are then described to the model by glmserve, ``chat/generic.py``)."""
    for name, parser in PARSERS.items():
        if parser.markers and template_source and all(marker in template_source for marker in parser.markers):
            return name
    return GenericParser.name


def output_parser(tool_parser: str | None, functions: list[dict[str, Any]] | None, reasoning: bool,
                  prompt_text: str, constrained: bool = False) -> ToolCallParser | None:
    """The parser for one reply: ``tool_parser``'s (a ``PARSERS`` name, None: no calls to parse)
    for ``functions``, behind a ``ReasoningParser`` when the template writes reasoning
    (``reasoning``, see ``has_reasoning``), started where ``prompt_text`` (the rendered prompt)
    left off; ``constrained``: a grammar writes the reply from its first token (it is the answer).
    None when there is nothing to parse (text is content as it comes)."""
    inner = PARSERS[tool_parser](functions) if tool_parser else None
    return ReasoningParser(inner, prompt_state(prompt_text), constrained=constrained) if reasoning else inner


def tag_texts(tool_parser: str | None, reasoning: bool) -> tuple[str, ...]:
    """The tags the parsers of a model's replies match in the text: ``<think>``/``</think>``
    when its template writes reasoning, and ``tool_parser``'s call tags. Where a vocabulary
    holds one as a single special token (GLM-4.5+ tokenizers have ``<think>``, ``<tool_call>``,
    ``<arg_key>``...; a GGUF may mark them as control tokens), the engine is asked to write that
    token's text (``GenerationRequest.shown_special_ids``), so the parsers see the tag whatever
    the vocabulary's marks: vLLM's GLM parsers match these tags by token id to the same end."""
    return ((THINK_START, THINK_END) if reasoning else ()) + (PARSERS[tool_parser].tags if tool_parser else ())


__all__ = ["tag_texts", "PARSERS", "ReasoningParser", "has_reasoning", "output_parser", "prompt_state", "DeltaEvent", "ParsedOutput", "ToolCallItem", "ToolCallParser", "assemble", "detect_parser"]
