"""What a client's output constraint costs, at glmserve's schema limits and unconstrained.

For each case: the grammar glmserve builds (``serving/structured/grammar.py``) and its size, the time
llama.cpp takes to load it (``llama_sampler_init_grammar``), and the decode time per token of a
greedy run of ``--tokens`` tokens with the grammar, on the default model. Every constraint
asks for a long output (``minLength``/``minItems``), and the prompt's evaluation is left out. Cases alternate over ``--rounds`` rounds in
one process; the table gives medians.

    python benchmarks/grammar_cost.py [--threads 2] [--tokens 48] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

from llama_cpp import Llama, LlamaGrammar, llama_cpp

from glmserve.bench.report import hardware
from glmserve.models import default_model_path
from glmserve.serving.structured.grammar import json_grammar
from glmserve.serving.structured.schema_check import SchemaLimits, check_enforceable, check_schema

LIMITS = SchemaLimits()
CASES = {
    "unconstrained": None,
    "string minLength 64, maxLength 1000": {"type": "string", "minLength": 64, "maxLength": LIMITS.max_repeat},
    "pattern ^[a-z]{64,1000}$": {"type": "string", "pattern": "^[a-z]{64,%d}$" % LIMITS.max_repeat},
    "pattern ^[a-z]{32,500}[a-z]{32,500}$": {"type": "string", "pattern": "^[a-z]{32,500}[a-z]{32,500}$"},
    "array of 16..1000 strings maxLength 20": {"type": "array", "minItems": 16, "maxItems": LIMITS.max_repeat,
                                                "items": {"type": "string", "maxLength": 20}},
    "60 properties, strings minLength 8 maxLength 1000 (near --max-grammar-bytes)": {
        "type": "object", "required": [f"p{i}" for i in range(60)],
        "properties": {f"p{i}": {"type": "string", "minLength": 8, "maxLength": LIMITS.max_repeat} for i in range(60)}},
}
PROMPT = "Write lowercase letters: abcdefghijklmnopqrstuvwxyz"


def grammar_of(schema: dict | None) -> str | None:
    if schema is None:
        return None
    checked = check_enforceable(check_schema(schema, "schema", LIMITS), "schema", LIMITS)
    return json_grammar(checked, "schema", LIMITS)


def load_ms(llm: Llama, gbnf: str) -> float:
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    t = time.perf_counter()
    sampler = llama_cpp.llama_sampler_init_grammar(vocab, gbnf.encode(), b"root")
    elapsed = (time.perf_counter() - t) * 1000
    if not sampler:
        raise RuntimeError("llama.cpp refused the grammar")
    llama_cpp.llama_sampler_free(sampler)
    return elapsed


def ms_per_token(llm: Llama, gbnf: str | None, tokens: int) -> tuple[float, int]:
    """Decode time per token after the first (the prompt's evaluation left out), and tokens made."""
    grammar = LlamaGrammar.from_string(gbnf, verbose=False) if gbnf else None
    llm.reset()
    stamps = [time.perf_counter() for _ in llm.create_completion(PROMPT, max_tokens=tokens, temperature=0,
                                                                 grammar=grammar, stream=True)]
    return (stamps[-1] - stamps[0]) * 1000 / max(1, len(stamps) - 1), len(stamps) - 1  # the last is the finish


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    llm = Llama(str(default_model_path()), n_ctx=1024, n_threads=args.threads, verbose=False)
    grammars = {name: grammar_of(schema) for name, schema in CASES.items()}
    loads: dict[str, list[float]] = {name: [] for name in CASES}
    steps: dict[str, list[float]] = {name: [] for name in CASES}
    lengths: dict[str, int] = {}
    for _ in range(args.rounds):
        for name, gbnf in grammars.items():
            if gbnf:
                loads[name].append(load_ms(llm, gbnf))
            per_token, lengths[name] = ms_per_token(llm, gbnf, args.tokens)
            steps[name].append(per_token)
    print(f"hardware: {hardware()}; model: {default_model_path().name}; threads {args.threads}; "
          f"greedy, up to {args.tokens} tokens; medians of {args.rounds} alternating rounds\n")
    print("| constraint | grammar bytes | load ms | tokens | ms/token |")
    print("|---|---:|---:|---:|---:|")
    for name, gbnf in grammars.items():
        load = f"{statistics.median(loads[name]):.1f}" if gbnf else "-"
        size = len(gbnf.encode()) if gbnf else "-"
        print(f"| {name} | {size} | {load} | {lengths[name]} | {statistics.median(steps[name]):.1f} |")


if __name__ == "__main__":
    main()
