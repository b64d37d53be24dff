"""Code vendored from other projects, unchanged but where its header says, each file with its
origin and licence: ``json_schema_to_grammar`` (llama.cpp's JSON-schema to GBNF converter, as
ported in llama-cpp-python; MIT). Not the project's own modules: kept to its source's form, not
to this project's module rules."""
