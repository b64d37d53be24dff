"""``tools`` / ``tool_choice`` / ``response_format`` -> what to render and how to constrain.

``tool_choice``: ``none`` (tools not offered), ``auto`` (offered; the model decides),
``required`` (the reply must be one or more calls) or ``{"type": "function", "function":
{"name": ...}}`` (the reply must call it). ``required`` and named are enforced with a grammar;
for GLM-4 the named function is also forced in the prompt, as GLM's own demo did. With the
``generic`` format ``auto`` is constrained too: plain text, or well-formed calls.

How many calls: ``parallel_tool_calls: false`` allows one; left unset, one or more with each
function at most once (a small model asked for one city's weather otherwise calls the same
function again until ``max_tokens``); ``true`` lets a function be called more than once (up to
``grammar.MAX_PARALLEL_CALLS`` calls). With the ``generic`` format and ``auto``, that rule holds
for the whole turn: a function called since the last user message is not offered again, and
once all have been called the reply is plain text (small models otherwise call the same tool
after its result, and an agent loop never ends).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from glmserve.protocol.chat import ChatCompletionRequest
from glmserve.protocol.errors import APIError, invalid_request
from glmserve.serving.generation.tool_formats import TOOL_FORMATS
from glmserve.serving.structured.grammar import GENERIC_CALLS, PLAIN_TEXT_GRAMMAR, json_grammar, tool_call_grammar
from glmserve.serving.structured.schema_check import SchemaLimits, check_enforceable, check_schema

_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


@dataclass(slots=True)
class ToolPlan:
    """``offered``: OpenAI tool dicts to render (None: no tools in the prompt); ``functions``:
    their function objects (what the parser accepts); ``choice``: ``none``, ``auto``,
    ``required`` or the forced function's name; ``grammar``: GBNF or None; ``forced_prefix``: text appended to the
    prompt and fed to the parser first (GLM-4 named); ``max_calls``: None for any number."""

    offered: list[dict[str, Any]] | None = None
    functions: list[dict[str, Any]] = field(default_factory=list)
    choice: str = "none"
    grammar: str | None = None
    forced_prefix: str = ""
    max_calls: int | None = None


def _functions(req: ChatCompletionRequest, limits: SchemaLimits) -> list[dict[str, Any]]:
    """The request's functions, names and parameter schemas checked (meta-schema and limits:
    the schema is rendered into the prompt even when no grammar is built from it)."""
    functions, seen = [], set()
    for i, tool in enumerate(req.tools or []):
        fn = tool.function.model_dump(exclude_none=True)
        if not _NAME.match(fn["name"]):
            raise invalid_request("function names must be 1-64 letters, digits, '_', '-' or '.'",
                                  f"tools.{i}.function.name")
        if fn["name"] in seen:
            raise invalid_request(f"duplicate function name {fn['name']!r}", f"tools.{i}.function.name")
        seen.add(fn["name"])
        params = fn.get("parameters")
        if params is not None:
            if not isinstance(params, dict) or params.get("type", "object") != "object":
                raise invalid_request("function parameters must be a JSON schema of type 'object'",
                                      f"tools.{i}.function.parameters")
            check_schema(params, f"tools.{i}.function.parameters", limits)
        functions.append(fn)
    return functions


def _choice(req: ChatCompletionRequest, names: set[str]) -> str:
    """'none' | 'auto' | 'required' | a function name."""
    choice = req.tool_choice
    if choice is None:
        return "auto" if names else "none"
    if isinstance(choice, str) and choice in ("none", "auto", "required"):
        if choice != "none" and not names:
            raise invalid_request(f"tool_choice {choice!r} needs tools", "tool_choice")
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if name not in names:
            raise invalid_request(f"tool_choice names function {name!r}, which is not in tools", "tool_choice")
        return name
    raise invalid_request("tool_choice must be 'none', 'auto', 'required' or "
                          "{'type': 'function', 'function': {'name': ...}}", "tool_choice")


def plan_tools(req: ChatCompletionRequest, parser: str | None, grammar_ok: bool, limits: SchemaLimits) -> ToolPlan:
    """Raises 400 ``APIError`` for invalid tools/tool_choice/response_format (schemas over
    ``limits`` included), or for what the server or engine cannot do (tool calling off, no
    constrained decoding)."""
    functions = _functions(req, limits)
    choice = _choice(req, {f["name"] for f in functions})
    plan = ToolPlan()
    fmt = req.response_format.type if req.response_format else "text"
    if fmt != "text":
        if not grammar_ok:
            raise invalid_request("this engine cannot constrain output to JSON", "response_format")
        if choice in ("required",) or choice not in ("none", "auto"):
            raise invalid_request("response_format cannot be combined with a forced tool_choice", "response_format")
        if fmt == "json_object":
            schema, param = {"type": "object"}, "response_format"
        else:
            spec = req.response_format.json_schema or {}
            param = "response_format.json_schema.schema"
            if "schema" not in spec:
                raise invalid_request("response_format json_schema needs json_schema.schema", param)
            schema = check_enforceable(check_schema(spec["schema"], param, limits), param, limits)
        plan.grammar = json_grammar(schema, param, limits)
        choice = "none"  # the reply is the JSON document
    if choice == "none":
        return plan
    if parser is None:
        raise invalid_request("tool calling is off on this server (--tool-call-parser none); send tool_choice "
                              "'none' or no tools", "tools")
    plan.offered = [{"type": "function", "function": f} for f in functions]
    plan.functions, plan.choice = functions, choice
    calls = {False: "one", None: "distinct", True: "any"}[req.parallel_tool_calls]
    plan.max_calls = 1 if calls == "one" else None
    index = {f["name"]: i for i, f in enumerate(functions)}
    if choice == "auto":
        if parser == "generic" and grammar_ok:
            if calls != "any":
                called = _called_this_turn(req)
                plan.functions = [f for f in functions if f["name"] not in called]
                plan.offered = [{"type": "function", "function": f} for f in plan.functions] or None
            params = [f"tools.{index[f['name']]}.function.parameters" for f in plan.functions]
            _constrain_auto(plan, calls, params, limits)
        return plan
    if not grammar_ok:
        raise invalid_request(f"tool_choice {req.tool_choice!r} needs constrained decoding, which this engine "
                              "lacks", "tool_choice")
    forced = [f for f in functions if f["name"] == choice] if choice != "required" else functions
    if choice != "required":
        plan.max_calls, calls = 1, "one"
        if parser == "glm4":  # force the name in the prompt, as GLM's demo did
            plan.offered = [{"type": "function", "function": forced[0]}]
            plan.forced_prefix = forced[0]["name"] + "\n"
    params = [f"tools.{index[f['name']]}.function.parameters" for f in forced]
    for f, param in zip(forced, params):
        check_enforceable(f.get("parameters") or {}, param, limits)  # the grammar is built from it
    plan.grammar = tool_call_grammar(TOOL_FORMATS[parser].grammar, forced, params, limits, calls,
                                     forced_name=bool(plan.forced_prefix))
    return plan


def _called_this_turn(req: ChatCompletionRequest) -> set[str]:
    """Names of the functions the assistant called after the last user message."""
    called: set[str] = set()
    for msg in reversed(req.messages):
        if msg.role == "user":
            break
        for call in getattr(msg, "tool_calls", None) or []:
            called.add(call.function.name)
    return called


def _constrain_auto(plan: ToolPlan, calls: str, params: list[str], limits: SchemaLimits) -> None:
    """Plain text or well-formed generic calls of ``plan.functions`` (plain text alone when
    there are none left), when every schema can be enforced; otherwise the reply stays
    unconstrained (``auto`` never refuses a schema the prompt can carry)."""
    if not plan.functions:
        plan.grammar = PLAIN_TEXT_GRAMMAR
        return
    try:
        for f, param in zip(plan.functions, params):
            check_enforceable(f.get("parameters") or {}, param, limits)
        plan.grammar = tool_call_grammar(GENERIC_CALLS, plan.functions, params, limits, calls, or_text=True)
    except APIError:
        plan.grammar = None
