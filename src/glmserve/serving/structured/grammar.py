"""Constrained decoding: GBNF grammars (llama.cpp's grammar format) for ``response_format``
and for ``tool_choice`` required/named, built with llama.cpp's JSON-schema converter
(``json_schema_to_grammar``, llama-cpp-python's port vendored in ``vendor/json_schema_to_grammar.py`` so
that no engine library is needed here), not a hand-written schema compiler. GBNF is the engines'
interface: llama.cpp loads it natively, the transformers and vllm engines compile it with xgrammar.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any
from dataclasses import dataclass

from glmserve.protocol.errors import invalid_request
from glmserve.vendor.json_schema_to_grammar import SchemaConverter
from glmserve.serving.structured.schema_check import SchemaLimits, subschemas
from glmserve.toolcalls.generic import OPENING as GENERIC_OPENING

# What the converter raises for input it cannot translate (it checks with assert and raises
# plain ValueError/KeyError); a schema that passed ``check_schema`` should not get here, but if
# one does it is the client's 400, not a 500.
_CONVERTER_ERRORS = (ValueError, KeyError, AssertionError, TypeError, IndexError, RecursionError)
# Nesting a grammar may have beyond its repetitions (groups of the fixed rules and formats).
MAX_FIXED_NESTING = 64


# what may hold parentheses that are not groups: literals, character classes, comments
_OPAQUE = re.compile(r'"(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]|#[^\n]*')


def _nesting_depth(gbnf: str) -> int:
    """Deepest parenthesis nesting in a GBNF text, outside literals, classes and comments."""
    depth = deepest = 0
    for paren in re.findall(r"[()]", _OPAQUE.sub("", gbnf)):
        depth += 1 if paren == "(" else -1
        deepest = max(deepest, depth)
    return deepest


def check_grammar(gbnf: str, param: str, limits: SchemaLimits) -> str:
    """``gbnf`` if llama.cpp can load it safely: at most ``limits.max_grammar_bytes`` and nested
    no deeper than the repetition bound allows (llama.cpp's parser recurses once per level).
    Raises a 400 ``APIError`` naming ``param`` otherwise."""
    size = len(gbnf.encode("utf-8"))
    if size > limits.max_grammar_bytes:
        raise invalid_request(f"the output constraint compiles to a grammar of {size} bytes, over the limit of "
                              f"{limits.max_grammar_bytes} (--max-grammar-bytes); use smaller repetition bounds "
                              "or fewer properties", param, "schema_too_large")
    if _nesting_depth(gbnf) > limits.max_repeat + MAX_FIXED_NESTING:
        raise invalid_request("the output constraint compiles to a grammar nested too deeply", param,
                              "schema_too_large")
    return gbnf


# ECMA-262 class escapes, as JSON Schema's patterns mean them (ASCII digits and word characters)
_CLASS_ESCAPES = {"d": "0-9", "w": "A-Za-z0-9_", "s": " \\t\\n\\r\\x0B\\x0C"}
# what the converter's pattern translator unescapes itself
_CONVERTER_ESCAPES = set("[]()|{}*+?")


def gbnf_pattern(pattern: str) -> str:
    """``pattern`` with the escapes llama.cpp's grammars lack spelled as classes and hex escapes
    (``\\d`` -> ``[0-9]``, ``\\.`` -> ``[\\x2E]``), so that the converter's translation loads.
    Raises ``ValueError`` for a negated class escape inside brackets (``[\\D]``)."""
    out, i, in_class = [], 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            e = pattern[i + 1]
            i += 2
            if e.lower() in _CLASS_ESCAPES:
                chars = _CLASS_ESCAPES[e.lower()]
                if e.isupper():
                    if in_class:
                        raise ValueError(f"\\{e} inside [...] is not supported")
                    chars = "^" + chars
                out.append(chars if in_class else f"[{chars}]")
            elif not e.isalnum() and e != "\\" and (in_class or e not in _CONVERTER_ESCAPES):
                out.append(f"\\x{ord(e):02X}" if in_class else f"[\\x{ord(e):02X}]")
            else:
                out.append(c + e)
            continue
        if c == "[" and not in_class:
            in_class = True
            if pattern[i + 1:i + 2] == "]" or pattern[i + 1:i + 3] == "^]":  # a leading ] is a character
                out.append(pattern[i:i + 2 + (pattern[i + 1] == "^")])
                i += 2 + (pattern[i + 1] == "^")
                continue
        elif c == "]" and in_class:
            in_class = False
        out.append(c)
        i += 1
    return "".join(out)


def _with_gbnf_patterns(schema: dict) -> dict:
    for node in subschemas(schema):
        if isinstance(node.get("pattern"), str):
            node["pattern"] = gbnf_pattern(node["pattern"])
    return schema


# a character of a JSON string, as llama.cpp's own converter (json-schema-to-grammar.cpp) writes
# it; llama-cpp-python's port admits raw control characters, which JSON forbids
STRICT_CHAR = r'[^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F])'


def _local_refs_only(node: Any, param: str) -> None:
    """A 400 for any ``$ref`` anywhere in ``node`` (a ``const`` value's included: the converter
    reads every ``$ref`` it finds) that is not a pointer into the schema itself: the converter
    would fetch an ``https://`` one, refused only by an ``assert`` that ``python -O`` removes."""
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            ref = item.get("$ref")
            if ref is not None and not (isinstance(ref, str) and ref.startswith("#/")):
                raise invalid_request(f"$ref {str(ref)[:80]!r}: only references into the schema itself ('#/...') "
                                      "are supported", param, "unsupported_schema")
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


class GrammarBuilder:
    """Rules for several schemas in one grammar; ``build(root)`` gives the GBNF text."""

    def __init__(self) -> None:
        self._conv = SchemaConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)

    def schema(self, schema: dict, name: str, param: str) -> str:
        """Add rules for ``schema`` (checked by ``check_schema``); returns the rule name matching
        one JSON value of it. Raises a 400 ``APIError`` naming ``param`` if the converter fails."""
        _local_refs_only(schema, param)
        try:
            resolved = self._conv.resolve_refs(_with_gbnf_patterns(json.loads(json.dumps(schema))), name)
            return self._conv.visit(resolved, name)
        except _CONVERTER_ERRORS as exc:
            raise invalid_request(f"the JSON schema cannot be turned into a grammar: {str(exc)[:200]}", param,
                                  "unsupported_schema") from exc

    def literal(self, text: str) -> str:
        return self._conv._format_literal(text)

    def rule(self, name: str, body: str) -> str:
        return self._conv._add_rule(name, body)

    def build(self, root: str) -> str:
        self._conv._add_rule("root", root)
        if "char" in self._conv._rules:  # JSON strings hold no raw control characters
            self._conv._rules["char"] = STRICT_CHAR
        return self._conv.format_grammar()


def json_grammar(schema: dict, param: str, limits: SchemaLimits) -> str:
    """The grammar of one JSON value of ``schema`` (checked by ``check_schema``). Raises a 400
    ``APIError`` naming ``param`` when it cannot be built or is over ``limits``."""
    builder = GrammarBuilder()
    return check_grammar(builder.build(builder.schema(schema, "json", param)), param, limits)


def _args_schema(function: dict) -> dict:
    return function.get("parameters") or {"type": "object", "properties": {}}


# plain text that cannot be taken for a generic call: not starting with "{" or whitespace; or nothing
_PLAIN_TEXT = "([^{ \\t\\r\\n] [^\\x00]*)?"
PLAIN_TEXT_GRAMMAR = f"root ::= {_PLAIN_TEXT}\n"
MAX_PARALLEL_CALLS = 8  # calls in one reply when a function may be called more than once


@dataclass(frozen=True)
class CallGrammar:
    """How one tool-call format writes its calls, for ``tool_call_grammar`` (each format's is
    named in its registration, ``serving/generation/tool_formats.py``): ``call(b, i, fn, param,
    forced_name)`` adds the rule of one call of ``fn`` (the ``i``-th function; ``param`` its
    request field, for errors; ``forced_name``: the prompt already ends with its name line) and
    returns its name; ``separator``: between two calls; ``single``: one call a turn whatever is
    asked (GLM-4); ``wrap(b, body, or_text)``: the calls' body inside what surrounds them."""

    call: Callable[[GrammarBuilder, int, dict, str, bool], str]
    separator: str = "\n"
    single: bool = False
    wrap: Callable[[GrammarBuilder, str, bool], str] | None = None


def tool_call_grammar(grammar: CallGrammar, functions: list[dict], params: list[str], limits: SchemaLimits,
                      calls: str = "one", forced_name: bool = False, or_text: bool = False) -> str:
    """A grammar that admits only well-formed calls of ``functions`` as ``grammar`` (a format's
    ``CallGrammar``: ``GLM45_CALLS``, ``GLM47_CALLS``, ``GLM4_CALLS``, ``HERMES_CALLS``,
    ``GENERIC_CALLS``) writes them. ``calls``: ``one`` (a single call), ``distinct`` (one or more,
    each function at most once, in the order given) or ``any`` (one to ``MAX_PARALLEL_CALLS``,
    repeats allowed); GLM-4 writes one call per turn whatever ``calls`` says. Bounded either way,
    so a model cannot loop on calls until it runs out of tokens. ``forced_name`` (glm4, one
    function): the prompt already ends with the name line, so the output is just the arguments.
    ``or_text`` (generic): the reply may instead be plain text that does not start with ``{`` or
    whitespace, or nothing (``tool_choice: auto``). ``params``: each function's field in the
    request (for errors). Raises a 400 ``APIError`` when a schema cannot be built or the grammar
    is over ``limits``."""
    b = GrammarBuilder()
    rules = [grammar.call(b, i, fn, params[i], forced_name) for i, fn in enumerate(functions)]
    sep = grammar.separator
    body = _call_sequence(b, rules, b.literal(sep) if sep else "", "one" if grammar.single else calls)
    if grammar.wrap is not None:
        body = grammar.wrap(b, body, or_text)
    return check_grammar(b.build(body), params[0] if len(params) == 1 else "tools", limits)


def _glm4_call(b: GrammarBuilder, i: int, fn: dict, param: str, forced_name: bool) -> str:
    """GLM-4: the name on its own line, then the arguments' JSON (just the JSON when the prompt
    holds the name)."""
    args = b.schema(_args_schema(fn), f"args{i}", param)
    return args if forced_name else b.rule(f"call{i}", f"{b.literal(fn['name'] + chr(10))} {args}")


def _json_call(b: GrammarBuilder, i: int, fn: dict, param: str, opening: str, closing: str) -> str:
    """``opening``, then ``{"name": NAME, "arguments": ARGS`` and ``closing``."""
    args = b.schema(_args_schema(fn), f"args{i}", param)
    head = b.literal(opening + '{"name": ' + json.dumps(fn["name"], ensure_ascii=False) + ', "arguments": ')
    return b.rule(f"call{i}", f"{head} {args} {b.literal(closing)}")


def _generic_wrap(b: GrammarBuilder, body: str, or_text: bool) -> str:
    body = f'{b.literal(GENERIC_OPENING)} {body} {b.literal("]}")}'
    return f'{b.rule("calls", body)} | {b.rule("text", _PLAIN_TEXT)}' if or_text else body


GLM45_CALLS = CallGrammar(lambda b, i, fn, param, _: b.rule(f"call{i}", _glm45_call(b, i, fn, param, newlines=True)))
GLM47_CALLS = CallGrammar(lambda b, i, fn, param, _: b.rule(f"call{i}", _glm45_call(b, i, fn, param, newlines=False)),
                          separator="")
GLM4_CALLS = CallGrammar(_glm4_call, single=True)
HERMES_CALLS = CallGrammar(lambda b, i, fn, param, _: _json_call(b, i, fn, param, "<tool_call>\n", "}\n</tool_call>"))
GENERIC_CALLS = CallGrammar(lambda b, i, fn, param, _: _json_call(b, i, fn, param, "", "}"), separator=", ",
                            wrap=_generic_wrap)


def _call_sequence(b: GrammarBuilder, calls: list[str], sep: str, mode: str) -> str:
    """The rule body for ``mode`` (see ``tool_call_grammar``) over the call rules ``calls``."""
    if len(calls) == 1 and mode != "any":
        return calls[0]
    if mode == "distinct":  # call_i, then any ordered subset of the calls after it
        after: dict[int, str] = {}
        for i in range(len(calls) - 1, 0, -1):
            after[i] = b.rule(f"after{i}", f"({sep} {calls[i]})? {after.get(i + 1, '')}".strip())
        return "(" + " | ".join(f"{calls[i]} {after.get(i + 1, '')}".strip() for i in range(len(calls))) + ")"
    one = calls[0] if len(calls) == 1 else b.rule("call", " | ".join(calls))
    return one if mode == "one" else f"{one} ({sep} {one}){{0,{MAX_PARALLEL_CALLS - 1}}}"



def _glm45_call(b: GrammarBuilder, i: int, fn: dict, param: str, newlines: bool) -> str:
    """One call in GLM-4.5's layout (``newlines``: name, keys and values each on their own
    line) or GLM-4.7's (all on one line; no arguments: ``<tool_call>name</tool_call>``)."""
    nl = chr(10) if newlines else ""
    schema = _args_schema(fn)
    properties = schema.get("properties", {})
    required = set(schema.get("required", []))
    parts = []
    for j, (key, prop) in enumerate(properties.items()):
        if isinstance(prop, dict) and prop.get("type") == "string":
            value = b.rule(f"val{i}-{j}", '[^<]*')
        else:
            value = b.schema(prop if isinstance(prop, dict) else {}, f"val{i}-{j}", param)
        pair = f'{b.literal(f"<arg_key>{key}</arg_key>" + nl + "<arg_value>")} {value} ' \
               f'{b.literal("</arg_value>" + nl)}'
        parts.append(pair if key in required else f"( {pair} )?")
    body = " ".join(parts) or '""'
    return f'{b.literal("<tool_call>" + fn["name"] + nl)} {body} {b.literal("</tool_call>")}'
