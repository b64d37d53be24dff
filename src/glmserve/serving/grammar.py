"""Constrained decoding: GBNF grammars (llama.cpp's grammar format) for ``response_format``
and for ``tool_choice`` required/named, built with llama-cpp-python's JSON-schema converter
(``llama_cpp.llama_grammar.SchemaConverter``, a port of llama.cpp's
``json_schema_to_grammar``), not a hand-written schema compiler.
"""

from __future__ import annotations

import json
from typing import Any

from llama_cpp.llama_grammar import SchemaConverter

from glmserve.protocol.errors import invalid_request

# JSON-schema keywords the converter honours (llama.cpp grammars/README.md "JSON Schemas");
# annotations it may ignore safely are listed too. Anything else is refused, not ignored.
SUPPORTED_KEYWORDS = {
    "type", "properties", "required", "additionalProperties", "items", "prefixItems", "minItems",
    "maxItems", "enum", "const", "oneOf", "anyOf", "allOf", "$ref", "$defs", "definitions", "pattern",
    "format", "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "description", "title", "default", "examples", "$schema", "$id", "$comment", "strict",
}


def unsupported_keywords(schema: Any) -> set[str]:
    """Keywords of ``schema`` (recursively) that the grammar converter would not enforce."""
    found: set[str] = set()
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key not in SUPPORTED_KEYWORDS:
                found.add(key)
            if key in ("properties", "$defs", "definitions") and isinstance(value, dict):
                for sub in value.values():
                    found |= unsupported_keywords(sub)
            elif key in ("items", "additionalProperties", "not"):
                found |= unsupported_keywords(value)
            elif key in ("prefixItems", "oneOf", "anyOf", "allOf") and isinstance(value, list):
                for sub in value:
                    found |= unsupported_keywords(sub)
    return found


def check_schema(schema: Any, param: str) -> dict:
    """400 unless ``schema`` is a JSON-schema object whose every keyword can be enforced."""
    if not isinstance(schema, dict):
        raise invalid_request("the JSON schema must be an object", param)
    bad = unsupported_keywords(schema)
    if bad:
        raise invalid_request(f"unsupported JSON schema features: {', '.join(sorted(bad))}", param,
                              "unsupported_schema")
    return schema


class GrammarBuilder:
    """Rules for several schemas in one grammar; ``build(root)`` gives the GBNF text."""

    def __init__(self) -> None:
        self._conv = SchemaConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)

    def schema(self, schema: dict, name: str) -> str:
        """Add rules for ``schema``; returns the rule name matching one JSON value of it."""
        resolved = self._conv.resolve_refs(json.loads(json.dumps(schema)), name)
        return self._conv.visit(resolved, name)

    def literal(self, text: str) -> str:
        return self._conv._format_literal(text)

    def rule(self, name: str, body: str) -> str:
        return self._conv._add_rule(name, body)

    def build(self, root: str) -> str:
        self._conv._add_rule("root", root)
        return self._conv.format_grammar()


def json_grammar(schema: dict) -> str:
    builder = GrammarBuilder()
    return builder.build(builder.schema(schema, "json"))


def _args_schema(function: dict) -> dict:
    return function.get("parameters") or {"type": "object", "properties": {}}


def tool_call_grammar(fmt: str, functions: list[dict], parallel: bool, forced_name: bool = False) -> str:
    """A grammar that admits only well-formed calls of ``functions`` in format ``fmt``
    (``hermes``, ``glm4``, ``glm45``); one call, or with ``parallel`` up to one per function
    (so that a model cannot loop on calls until it runs out of tokens).
    ``forced_name`` (glm4, one function): the prompt already ends with the name line, so the
    output is just the arguments."""
    b = GrammarBuilder()
    calls = []
    for i, fn in enumerate(functions):
        name = fn["name"]
        if fmt == "glm45":
            calls.append(b.rule(f"call{i}", _glm45_call(b, i, fn)))
            continue
        args = b.schema(_args_schema(fn), f"args{i}")
        if fmt == "glm4":
            calls.append(args if forced_name else b.rule(f"call{i}", f"{b.literal(name + chr(10))} {args}"))
        else:  # hermes
            head = b.literal('<tool_call>\n{"name": ' + json.dumps(name, ensure_ascii=False) + ', "arguments": ')
            calls.append(b.rule(f"call{i}", f'{head} {args} {b.literal("}" + chr(10) + "</tool_call>")}'))
    one = calls[0] if len(calls) == 1 else b.rule("call", " | ".join(calls))
    if parallel and fmt != "glm4" and len(functions) > 1:  # GLM-4 writes one call per turn
        return b.build(f'{one} ({b.literal(chr(10))} {one}){{0,{len(functions) - 1}}}')
    return b.build(one)


def _glm45_call(b: GrammarBuilder, i: int, fn: dict) -> str:
    schema = _args_schema(fn)
    properties = schema.get("properties", {})
    required = set(schema.get("required", []))
    parts = []
    for j, (key, prop) in enumerate(properties.items()):
        if isinstance(prop, dict) and prop.get("type") == "string":
            value = b.rule(f"val{i}-{j}", '[^<]*')
        else:
            value = b.schema(prop if isinstance(prop, dict) else {}, f"val{i}-{j}")
        pair = f'{b.literal(f"<arg_key>{key}</arg_key>" + chr(10) + "<arg_value>")} {value} ' \
               f'{b.literal("</arg_value>" + chr(10))}'
        parts.append(pair if key in required else f"( {pair} )?")
    body = " ".join(parts) or '""'
    return f'{b.literal("<tool_call>" + fn["name"] + chr(10))} {body} {b.literal("</tool_call>")}'
