"""Client schema checks (``serving/structured/schema_check.py``) and the pattern spelling for llama.cpp
(``serving/structured/grammar.py``), table-driven; the same families run against a real server in
``tests/e2e/test_hostile.py``."""

from __future__ import annotations

import re

import pytest

from glmserve.protocol.errors import APIError
from glmserve.serving.structured.grammar import check_grammar, gbnf_pattern, json_grammar
from glmserve.serving.structured.schema_check import SchemaLimits, check_enforceable, check_schema

LIMITS = SchemaLimits(max_depth=8, max_nodes=50, max_repeat=100, max_grammar_bytes=4096)


def _check(schema):
    return check_enforceable(check_schema(schema, "p", LIMITS), "p", LIMITS)


@pytest.mark.parametrize(("schema", "code", "words"), [
    ({"type": "string", "maxLength": 101}, "schema_too_large", "maxLength 101"),
    ({"type": "array", "minItems": 500}, "schema_too_large", "minItems 500"),
    ({"enum": list(range(60))}, "schema_too_large", "--max-schema-nodes"),
    ({"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "object", "properties": {
        "c": {"type": "object", "properties": {"d": {"type": "string"}}}}}}}}}, "schema_too_large", "deeper than 8"),
    ({"type": "strin"}, "invalid_schema", "type"),
    ({"type": "object", "required": "a"}, "invalid_schema", "required"),
    ({"type": "string", "pattern": "^(a$"}, "invalid_schema", "regex"),
    ({"not": {}}, "unsupported_schema", "not"),
    ({"$ref": "#"}, "unsupported_schema", "'#'"),
    ({"$ref": "http://x/y.json"}, "unsupported_schema", "only references into the schema"),
    ({"$ref": "#/$defs/x"}, "invalid_schema", "does not resolve"),
    ({"$defs": {"x": {"$ref": "#/$defs/x"}}, "$ref": "#/$defs/x"}, "unsupported_schema", "refers to itself"),
    ({"type": "string", "pattern": "abc"}, "unsupported_schema", "anchored"),
    ({"type": "string", "pattern": "^(?:ab)$"}, "unsupported_schema", "(?...)"),
    ({"type": "string", "pattern": "^(a)\\1$"}, "unsupported_schema", "back-references"),
    ({"type": "string", "pattern": "^a\\bb$"}, "unsupported_schema", "anchors inside"),
    ({"type": "string", "pattern": "^(a|bc)+$"}, "unsupported_schema", "fixed, non-zero length"),
    ({"type": "string", "pattern": "^(x?){0,9}$"}, "unsupported_schema", "fixed, non-zero length"),
    ({"type": "string", "pattern": "^a{0,101}$"}, "schema_too_large", "bound of 101"),
    ({"type": "string", "pattern": "^a{0,60}b{0,60}$"}, "schema_too_large", "add up to 120"),
])
def test_refused(schema, code, words):
    with pytest.raises(APIError) as info:
        _check(schema)
    assert (info.value.status_code, info.value.code, info.value.param) == (400, code, "p")
    assert words in info.value.message


@pytest.mark.parametrize("schema", [
    {"type": "string", "maxLength": 100},
    {"type": "string", "pattern": "^\\d{4}-\\d{2}-\\d{2}$"},
    {"type": "string", "pattern": "^(\\+\\d{1,3})?[0-9]{10}$"},
    {"type": "string", "pattern": "^(ab){3}[a-z]+$"},
    {"$defs": {"c": {"type": "string"}}, "type": "object", "properties": {"c": {"$ref": "#/$defs/c"}}},
    {"type": "object", "properties": {"a": {"$ref": "#/$defs/b"}}, "$defs": {"b": {"$ref": "#/$defs/c"}, "c": {}}},
])
def test_accepted_and_within_the_grammar_limits(schema):
    assert _check(schema) is schema
    check_grammar(json_grammar(schema, "p", LIMITS), "p", LIMITS)


def test_grammar_size_limit():
    schema = {"type": "object", "properties": {f"p{i}": {"type": "string", "maxLength": 100} for i in range(8)}}
    with pytest.raises(APIError) as info:
        json_grammar(_check(schema), "p", LIMITS)
    assert info.value.code == "schema_too_large" and "--max-grammar-bytes" in info.value.message


def test_grammar_nesting_limit():
    deep = "root ::= " + "(" * 200 + '"a"' + ")" * 200
    with pytest.raises(APIError, match="nested too deeply"):
        check_grammar(deep, "p", SchemaLimits(max_repeat=100))
    check_grammar('root ::= "((((((" [(((] # (((((', "p", SchemaLimits(max_repeat=1))


@pytest.mark.parametrize(("pattern", "spelled"), [
    (r"^\d{4}$", r"^[0-9]{4}$"),
    (r"^[\w.\-]+$", r"^[A-Za-z0-9_.\x2D]+$"),
    (r"^a\.b\$\/$", r"^a[\x2E]b[\x24][\x2F]$"),
    (r"^\S\D\W$", r"^[^ \t\n\r\x0B\x0C][^0-9][^A-Za-z0-9_]$"),
    (r"^\(a\)\+$", r"^\(a\)\+$"),  # the converter unescapes these itself
    (r"^[]a][^]b]$", r"^[]a][^]b]$"),
    (r"^a\\b$", r"^a\\b$"),
])
def test_gbnf_pattern(pattern, spelled):
    assert gbnf_pattern(pattern) == spelled
    for text in ("2024", "a.b$/", "ab_-.", "(a)+"):
        assert bool(re.fullmatch(pattern[1:-1], text)) == bool(re.fullmatch(spelled[1:-1], text))


def test_gbnf_pattern_refuses_negated_escape_in_brackets():
    with pytest.raises(ValueError):
        gbnf_pattern(r"^[\D]$")
