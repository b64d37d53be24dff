"""The tool-call formats, each one registration (as vLLM registers its tool parsers by name):
``ToolFormat`` names the format's parser (``toolcalls``: reads its calls out of a reply), how a
request's offered tools reach the prompt (``render``), and how its calls are written for a
grammar that forces them (``grammar``, ``serving/structured/grammar.py``). ``TOOL_FORMATS`` holds
them by name; ``--tool-call-parser`` takes these names (``settings/model.py`` lists the parsers'
names, and a test holds the three equal).

A new format: its parser in ``toolcalls/`` (named in ``toolcalls.PARSERS``), its ``CallGrammar``
in ``serving/structured/grammar.py``, and its row here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from glmserve.chat import ChatTemplate
from glmserve.chat.generic import to_generic_messages
from glmserve.chat.glm4 import to_glm4_items
from glmserve.serving.structured.grammar import (
    GENERIC_CALLS,
    GLM4_CALLS,
    GLM45_CALLS,
    GLM47_CALLS,
    HERMES_CALLS,
    CallGrammar,
)
from glmserve.toolcalls import ToolCallParser
from glmserve.toolcalls.generic import GenericParser
from glmserve.toolcalls.glm4 import Glm4Parser
from glmserve.toolcalls.glm45 import Glm45Parser, Glm47Parser
from glmserve.toolcalls.hermes import HermesParser

# (template, the conversation's messages, the request's tool plan (``tools.ToolPlan``: its ``offered``
# tools, ``functions`` and ``choice``), template variables) -> the prompt text
Render = Callable[[ChatTemplate, list[dict[str, Any]], Any, dict[str, Any]], str]


@dataclass(frozen=True)
class ToolFormat:
    """A tool-call format: ``name`` (``--tool-call-parser``'s), ``parser`` (reads its calls),
    ``render`` (the prompt with the offered tools where the format puts them), ``grammar`` (its
    calls, for ``tool_choice`` required or named)."""

    name: str
    parser: type[ToolCallParser]
    render: Render
    grammar: CallGrammar


def _template_tools(template: ChatTemplate, messages: list[dict[str, Any]], plan: Any,
                    kwargs: dict[str, Any]) -> str:
    """The template's own ``tools`` variable (GLM-4.5+, hermes: the template writes them)."""
    return template.render(messages, tools=plan.offered, **kwargs)


def _glm4_items(template: ChatTemplate, messages: list[dict[str, Any]], plan: Any,
                kwargs: dict[str, Any]) -> str:
    """GLM-4's own message layout (``chat/glm4.py``: the tools in its system message)."""
    return template.render(to_glm4_items(messages, plan.offered), **kwargs)


def _generic_messages(template: ChatTemplate, messages: list[dict[str, Any]], plan: Any,
                      kwargs: dict[str, Any]) -> str:
    """glmserve's system message for a template without a tool format (``chat/generic.py``,
    which also rewrites the history's calls and results)."""
    return template.render(to_generic_messages(messages, plan.functions if plan.offered else None, plan.choice),
                           **kwargs)


TOOL_FORMATS: dict[str, ToolFormat] = {f.name: f for f in (
    ToolFormat("glm47", Glm47Parser, _template_tools, GLM47_CALLS),
    ToolFormat("glm45", Glm45Parser, _template_tools, GLM45_CALLS),
    ToolFormat("glm4", Glm4Parser, _glm4_items, GLM4_CALLS),
    ToolFormat("hermes", HermesParser, _template_tools, HERMES_CALLS),
    ToolFormat("generic", GenericParser, _generic_messages, GENERIC_CALLS),
)}


def render_prompt(template: ChatTemplate, messages: list[dict[str, Any]], plan: Any, tool_format: str | None,
                  kwargs: dict[str, Any]) -> str:
    """The prompt text of ``messages`` with ``plan``'s offered tools where ``tool_format`` (a
    ``TOOL_FORMATS`` name; None: the template's ``tools`` variable) puts them. Raises what the
    template raises (``ChatTemplateError``)."""
    render = TOOL_FORMATS[tool_format].render if tool_format else _template_tools
    return render(template, messages, plan, kwargs)
