"""Structured output: JSON schemas checked against their bounds (``schema_check``) and
compiled to GBNF grammars (``grammar``, with ``glmserve.vendor.json_schema_to_grammar``) for ``response_format`` and
forced tool calls."""
