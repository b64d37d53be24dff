"""The vendored JSON-schema to GBNF converter (``vendor/json_schema_to_grammar.py``) gives the
same grammars as the llama-cpp-python it was copied from, for the schema families glmserve
builds grammars from (response formats and every tool-call format), so the vllm/transformers
installs without llama.cpp constrain output exactly as the llama_cpp install does."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from glmserve.serving.generation.tool_formats import TOOL_FORMATS
from glmserve.serving.structured import grammar
from glmserve.vendor import json_schema_to_grammar
from glmserve.serving.structured.schema_check import SchemaLimits

llama_grammar = pytest.importorskip("llama_cpp.llama_grammar")

SCHEMAS = [
    {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
     "required": ["city"]},
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}, "minItems": 1,
                                               "maxItems": 4}}, "additionalProperties": False},
    {"type": "object", "additionalProperties": {"type": "integer"}},
    {"anyOf": [{"type": "number"}, {"type": "null"}, {"type": "boolean"}]},
    {"type": "string", "pattern": r"^\d{3}-[a-z]+\.x$"},
    {"type": "string", "format": "date-time"},
    {"type": "string", "minLength": 2, "maxLength": 5},
    {"type": "integer", "minimum": 0},
    {"const": {"a": [1, 2, "three"]}},
    {"$defs": {"c": {"type": "string"}}, "type": "object", "properties": {"c": {"$ref": "#/$defs/c"}}},
    {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}]},
    {"oneOf": [{"type": "object", "properties": {"kind": {"const": "a"}}, "required": ["kind"]},
               {"type": "object", "properties": {"kind": {"const": "b"}, "n": {"type": "number"}}}]},
    {},
]
FUNCTIONS = [{"name": "get_weather", "parameters": SCHEMAS[0]}, {"name": "tag", "parameters": SCHEMAS[1]},
             {"name": "noop"}]


@pytest.mark.parametrize("schema", SCHEMAS, ids=range(len(SCHEMAS)))
def test_converter_matches_llama_cpp_python(schema):
    text = json.dumps(schema)
    assert json_schema_to_grammar.json_schema_to_gbnf(text) == llama_grammar.json_schema_to_gbnf(text)


def _both(monkeypatch, build):
    vendored = build()
    monkeypatch.setattr(grammar, "SchemaConverter", llama_grammar.SchemaConverter)
    return vendored, build()


@pytest.mark.parametrize("schema", SCHEMAS, ids=range(len(SCHEMAS)))
def test_response_format_grammar_matches(monkeypatch, schema):
    vendored, upstream = _both(monkeypatch, lambda: grammar.json_grammar(schema, "response_format", SchemaLimits()))
    assert vendored == upstream


@pytest.mark.parametrize("fmt", ["generic", "hermes", "glm4", "glm45", "glm47"])
@pytest.mark.parametrize("calls", ["one", "distinct", "any"])
def test_tool_call_grammars_match(monkeypatch, fmt, calls):
    params = [f"tools[{i}].function.parameters" for i in range(len(FUNCTIONS))]
    vendored, upstream = _both(monkeypatch, lambda: grammar.tool_call_grammar(
        TOOL_FORMATS[fmt].grammar, FUNCTIONS, params, SchemaLimits(), calls=calls, or_text=fmt == "generic"))
    assert vendored == upstream
    assert "get_weather" in vendored


def test_a_remote_ref_anywhere_is_refused_even_under_python_O(tmp_path):
    """The converter fetches an ``https://`` ``$ref`` wherever it finds one (a ``const`` value's
    too, which ``check_schema`` does not read as a schema), refused only by an ``assert``: under
    ``python -O`` it would have fetched it (issue 91, 7). Run in ``python -O``, with ``requests``
    made to fail the run if it is ever asked for."""
    (tmp_path / "requests.py").write_text("raise SystemExit('the converter imported requests to fetch a $ref')\n")
    script = (
        "from glmserve.protocol.errors import APIError\n"
        "from glmserve.serving.structured.grammar import json_grammar\n"
        "from glmserve.serving.structured.schema_check import SchemaLimits, check_schema\n"
        "schema = {'type': 'object', 'properties': {'a': {'const': {'$ref': 'https://example.invalid/s.json'}}}}\n"
        "check_schema(schema, 'response_format', SchemaLimits())\n"
        "try:\n"
        "    json_grammar(schema, 'response_format', SchemaLimits())\n"
        "except APIError as exc:\n"
        "    print(exc.status_code, exc.code)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    run = subprocess.run([sys.executable, "-O", "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert (run.returncode, run.stdout.strip()) == (0, "400 unsupported_schema"), run.stderr
