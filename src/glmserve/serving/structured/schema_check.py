"""Client JSON schemas (``response_format.json_schema.schema``, ``tools[].function.parameters``)
checked before anything is built from them: valid JSON Schema, within glmserve's limits, and
in the subset the grammar converter can enforce. Every failure is a 400 naming the field.

The limits exist because a grammar grows with the schema: llama.cpp's JSON-schema converter
spells a bounded repetition (``maxLength: n``, ``maxItems: n``, ``{m,n}`` in a ``pattern``) as
``n`` nested groups, and llama.cpp parses nested groups recursively, so an unbounded ``n`` is a
stack overflow (the process dies) or gigabytes of rules.

Sources: the JSON Schema 2020-12 meta-schema (``jsonschema``'s ``check_schema``); the converter's
supported subset (llama.cpp ``grammars/README.md``, "JSON Schemas"; its pattern translator takes
anchored patterns without ``(?...)`` groups or back-references).
"""

from __future__ import annotations

import re
import re._constants as _c  # Python's own regular-expression parser (3.11+), to analyse patterns
import re._parser as _sre
from dataclasses import dataclass
from typing import Any

import jsonschema

from glmserve.protocol.errors import invalid_request

# JSON-schema keywords the converter honours; annotations it may ignore safely are listed too.
# Anything else is refused, not ignored.
SUPPORTED_KEYWORDS = frozenset({
    "type", "properties", "required", "additionalProperties", "items", "prefixItems", "minItems",
    "maxItems", "enum", "const", "oneOf", "anyOf", "allOf", "$ref", "$defs", "definitions", "pattern",
    "format", "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "description", "title", "default", "examples", "$schema", "$id", "$comment", "strict",
})
_REPEAT_KEYWORDS = ("minLength", "maxLength", "minItems", "maxItems")
_SUBSCHEMA_MAPS = ("properties", "$defs", "definitions")
_SUBSCHEMA_LISTS = ("prefixItems", "oneOf", "anyOf", "allOf")
_SUBSCHEMA_ONE = ("items", "additionalProperties", "not")


@dataclass(frozen=True, slots=True)
class SchemaLimits:
    """Bounds on what a client schema may cost (settings ``--max-schema-*``, ``--max-grammar-bytes``).

    ``max_depth``: nesting of objects and arrays in the schema document; ``max_nodes``: values in
    it (objects, arrays, scalars); ``max_repeat``: the largest repetition bound (``minLength``,
    ``maxLength``, ``minItems``, ``maxItems``, ``{m,n}``); ``max_grammar_bytes``: size of the
    grammar built from the request's schemas together."""

    max_depth: int = 32
    max_nodes: int = 10_000
    max_repeat: int = 1000
    max_grammar_bytes: int = 512 * 1024


def check_schema(schema: Any, param: str, limits: SchemaLimits) -> dict:
    """``schema`` if it is a valid JSON schema object (2020-12 meta-schema) within ``limits``'
    depth and size; else a 400 ``APIError`` naming ``param``."""
    if not isinstance(schema, dict):
        raise invalid_request("the JSON schema must be an object", param)
    _check_size(schema, param, limits)
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(root)"
        raise invalid_request(f"invalid JSON schema at {where}: {exc.message[:300]}", param, "invalid_schema") from exc
    return schema


def check_enforceable(schema: dict, param: str, limits: SchemaLimits) -> dict:
    """``schema`` (already through ``check_schema``) if a grammar can be built from it safely:
    every keyword one the converter enforces, repetition bounds within ``limits.max_repeat``,
    every ``pattern`` anchored and plain, every ``$ref`` local, resolvable and acyclic. Else a
    400 ``APIError`` naming ``param``."""
    bad = unsupported_keywords(schema)
    if bad:
        raise invalid_request(f"unsupported JSON schema features: {', '.join(sorted(bad))}", param,
                              "unsupported_schema")
    for node in subschemas(schema):
        _check_node(node, param, limits)
    _check_refs(schema, param)
    return schema


def _check_size(schema: dict, param: str, limits: SchemaLimits) -> None:
    """Depth and node count, iteratively (a deep schema must not overflow Python's stack)."""
    nodes, stack = 0, [(schema, 1)]
    while stack:
        value, depth = stack.pop()
        nodes += 1
        if nodes > limits.max_nodes:
            raise invalid_request(f"the JSON schema has more than {limits.max_nodes} values (limit: "
                                  "--max-schema-nodes)", param, "schema_too_large")
        if depth > limits.max_depth:
            raise invalid_request(f"the JSON schema is nested deeper than {limits.max_depth} levels (limit: "
                                  "--max-schema-depth)", param, "schema_too_large")
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)


def subschemas(schema: Any):
    """Every (sub)schema object of ``schema`` where the converter reads keywords."""
    if not isinstance(schema, dict):
        return
    yield schema
    for key, value in schema.items():
        if key in _SUBSCHEMA_MAPS and isinstance(value, dict):
            for sub in value.values():
                yield from subschemas(sub)
        elif key in _SUBSCHEMA_ONE:
            yield from subschemas(value)
        elif key in _SUBSCHEMA_LISTS and isinstance(value, list):
            for sub in value:
                yield from subschemas(sub)


def unsupported_keywords(schema: Any) -> set[str]:
    """Keywords of ``schema`` (recursively) that the grammar converter would not enforce."""
    return {key for node in subschemas(schema) for key in node if key not in SUPPORTED_KEYWORDS}


def _check_node(node: dict, param: str, limits: SchemaLimits) -> None:
    for key in _REPEAT_KEYWORDS:
        if isinstance(node.get(key), int) and node[key] > limits.max_repeat:
            raise invalid_request(f"{key} {node[key]} is over the limit of {limits.max_repeat} (--max-schema-repeat)",
                                  param, "schema_too_large")
    if "pattern" in node:
        _check_pattern(node["pattern"], param, limits)


def _check_pattern(pattern: str, param: str, limits: SchemaLimits) -> None:
    """The subset of regular expressions the converter turns into grammar rules, and whose
    grammar stays cheap to match: anchored (``^...$``); no lookaround, back-references,
    ``(?...)`` groups or anchors inside; every part repeated more than once (``*``, ``+``,
    ``{m,n}``) of one fixed, non-zero length (a repeated part of varying length can be split in
    many ways, and llama.cpp then tracks every split: ``(a|bc)*`` or ``([a-z]?){0,1000}`` make
    each token cost seconds to minutes); repetition bounds adding up to ``limits.max_repeat``.
    Parsed with Python's own regular-expression parser (``re._parser``)."""
    where = f"pattern {pattern[:80]!r}"
    if len(pattern) < 2 or not pattern.startswith("^") or not pattern.endswith("$") or pattern.endswith("\\$"):
        raise invalid_request(f"{where}: patterns must be anchored, '^...$' (only whole-string patterns can be "
                              "enforced)", param, "unsupported_schema")
    if "(?" in pattern:
        raise invalid_request(f"{where}: '(?...)' groups (lookaround, non-capturing, named, flags) are not "
                              "supported", param, "unsupported_schema")
    try:
        tree = _sre.parse(pattern)
    except (re.error, OverflowError, RecursionError) as exc:
        raise invalid_request(f"{where} is not a valid regular expression: {exc}", param, "invalid_schema") from exc
    body = list(tree)[1:-1]  # without the leading ^ and the trailing $
    total = _pattern_cost(body, where, param, limits)
    if total > limits.max_repeat:
        raise invalid_request(f"{where}: its repetition bounds add up to {total}, over the limit of "
                              f"{limits.max_repeat} (--max-schema-repeat)", param, "schema_too_large")


def _pattern_cost(items, where: str, param: str, limits: SchemaLimits) -> int:
    """The sum of the repetition bounds in a parsed pattern (an unbounded one counts its
    minimum); raises a 400 for what ``_check_pattern`` refuses."""
    total = 0
    for op, av in items:
        if op in (_c.ASSERT, _c.ASSERT_NOT, _c.GROUPREF, _c.GROUPREF_EXISTS, _c.AT, _c.ATOMIC_GROUP,
                  _c.POSSESSIVE_REPEAT):
            raise invalid_request(f"{where}: lookaround, back-references, atomic groups, possessive quantifiers "
                                  "and anchors inside the pattern are not supported", param, "unsupported_schema")
        if op is _c.SUBPATTERN:
            total += _pattern_cost(av[3], where, param, limits)
        elif op is _c.BRANCH:
            total += sum(_pattern_cost(branch, where, param, limits) for branch in av[1])
        elif op in (_c.MAX_REPEAT, _c.MIN_REPEAT):
            low, high, item = av
            bound = low if high is _c.MAXREPEAT else high
            if bound > limits.max_repeat:
                raise invalid_request(f"{where}: a repetition bound of {bound} is over the limit of "
                                      f"{limits.max_repeat} (--max-schema-repeat)", param, "schema_too_large")
            if high is _c.MAXREPEAT or high > 1:
                shortest, longest = item.getwidth()
                if shortest != longest or shortest == 0:
                    raise invalid_request(f"{where}: a part repeated with *, + or {{m,n}} must have one fixed, "
                                          "non-zero length (e.g. [a-z]{2,8}, not (a|bc)+ or (x?)*)", param,
                                          "unsupported_schema")
            total += bound + _pattern_cost(item, where, param, limits)
    return total


def _check_refs(root: dict, param: str) -> None:
    """Every ``$ref`` is a JSON pointer into this document ("#/..."), resolves, and no chain of
    references leads back to a schema it started from (a grammar rule defined by itself)."""
    targets: dict[str, Any] = {}
    for node in subschemas(root):
        ref = node.get("$ref")
        if ref is None:
            continue
        if not isinstance(ref, str) or not ref.startswith("#/"):
            raise invalid_request(f"$ref {str(ref)[:80]!r}: only references into the schema itself ('#/...') are "
                                  "supported", param, "unsupported_schema")
        targets[ref] = _resolve(root, ref, param)
    for ref in targets:
        _check_acyclic(ref, targets, param)


def _resolve(root: dict, ref: str, param: str) -> Any:
    target: Any = root
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(target, dict) or part not in target:
            raise invalid_request(f"$ref {ref[:80]!r} does not resolve in the schema", param, "invalid_schema")
        target = target[part]
    if not isinstance(target, dict):
        raise invalid_request(f"$ref {ref[:80]!r} does not point to a schema object", param, "invalid_schema")
    return target


def _check_acyclic(start: str, targets: dict[str, Any], param: str) -> None:
    seen, stack = {start}, [start]
    while stack:
        for node in subschemas(targets[stack.pop()]):
            ref = node.get("$ref")
            if ref == start:
                raise invalid_request(f"$ref {start[:80]!r} refers to itself (recursive schemas are not supported)",
                                      param, "unsupported_schema")
            if ref in targets and ref not in seen:
                seen.add(ref)
                stack.append(ref)
