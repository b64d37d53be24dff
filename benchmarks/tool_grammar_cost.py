"""What constrained tool calling costs per token on glmserve's llama_cpp engine, in-process.

Cases (greedy, the default model): an unconstrained story; the same story under the generic
format's ``tool_choice: auto`` grammar (plain text or calls: every token is checked); a
``required`` call; a ``response_format`` JSON object. Time per generated token from the first
output to the last (the prompt's evaluation left out), cases alternating over ``--rounds``
rounds in one process; the table gives medians.

    python benchmarks/tool_grammar_cost.py [--threads 2] [--tokens 64] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from glmserve.bench.report import hardware
from glmserve.engine.types import GenerationRequest, SamplingParams
from glmserve.runtime.start import start_model
from glmserve.serving.structured.grammar import GENERIC_CALLS, json_grammar, tool_call_grammar
from glmserve.serving.structured.schema_check import SchemaLimits
from glmserve.settings.serve import ServeSettings

LIMITS = SchemaLimits()
WEATHER = {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"]}}
STORY = "Write a long story about a cat."
CALL = "What is the weather in Paris? Reply with the JSON call."
CASES = {
    "unconstrained (text)": (STORY, None),
    "tool_choice auto grammar (text)": (STORY, tool_call_grammar(GENERIC_CALLS, [WEATHER], ["t"], LIMITS, "distinct",
                                                                or_text=True)),
    "tool_choice required (a call)": (CALL, tool_call_grammar(GENERIC_CALLS, [WEATHER], ["t"], LIMITS, "distinct")),
    "response_format json_object": ("Describe a cat as JSON.", json_grammar({"type": "object"}, "r", LIMITS)),
}


async def ms_per_token(engine, prompt: str, grammar: str | None, tokens: int) -> tuple[float, int]:
    ids = engine.tokenizer.encode_prompt(f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n")
    request = GenerationRequest(request_id=f"bench-{time.perf_counter_ns()}", prompt_token_ids=ids,
                                sampling=SamplingParams(max_tokens=tokens, temperature=0, grammar=grammar))
    stamps, n = [], 0
    async for out in engine.generate(request):
        stamps.append(time.perf_counter())
        n += len(out.token_ids)
    return (stamps[-1] - stamps[0]) * 1000 / max(1, n - 1), n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    loaded = start_model(ServeSettings(n_threads=args.threads))
    engine = loaded.engine
    times: dict[str, list[float]] = {name: [] for name in CASES}
    lengths: dict[str, int] = {}

    async def run() -> None:
        for _ in range(args.rounds):
            for name, (prompt, grammar) in CASES.items():
                per_token, lengths[name] = await ms_per_token(engine, prompt, grammar, args.tokens)
                times[name].append(per_token)

    try:
        asyncio.run(run())
    finally:
        engine.shutdown()
    print(f"hardware: {hardware()} | model: SmolLM2-135M-Instruct Q4_1 (embedded default) | engine llama_cpp | "
          f"threads {args.threads} | concurrency 1 | greedy, up to {args.tokens} tokens | medians of {args.rounds} "
          "alternating rounds\n")
    print("| case | tokens | ms/token |")
    print("|---|---:|---:|")
    for name in CASES:
        print(f"| {name} | {lengths[name]} | {statistics.median(times[name]):.1f} |")


if __name__ == "__main__":
    main()
