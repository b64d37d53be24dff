"""Agent-shaped prompts: glmserve against llama.cpp's ``llama-server`` on the same GGUF, in
rounds of one run in ABBA order; medians per turn, and glmserve's TTFT against llama-server's as
the median of per-round ratios (docs/engineering/measuring.md).

Scenarios (``--scenarios``; each starts every system afresh, so no cache carries over):
- ``single-6k`` / ``single-12k`` (any ``single-N``): one session, a coding agent's long system
  prompt (tool docs and instructions, ~6k or ~12k tokens) and a task, then turns that append the
  model's reply and a tool result (~450 tokens): TTFT per turn, prompt tokens, cached share,
  prefill tok/s.
- ``shared-4``: four sessions at once sharing one ~6k system prompt, each with its own task
  (subagents): the time until all four have their first token, and each TTFT.
- ``evicted``: two sequences; session A's turns 1 and 2 (warm), then two other sessions (~3k
  each, at once) take both sequences, then A's turn 3: its TTFT against the warm turn 2
  (restored from host memory, or prefilled again).
- ``claude-code`` (with ``--claude PATH``): Claude Code itself, headless (``claude -p``) with its
  full default prompt (system text and its 24 tools), against glmserve at ``--n-ctx 32768``:
  wall time of the first turn and of a second one (``--continue``), and the prompt tokens the
  server computed or found cached.

Systems: ``glmserve`` (defaults: ``--n-ctx 16384``, one sequence per session), ``glmserve
--batch-invariant`` (``--systems`` to add it), ``llama-server`` (its defaults: ``-c`` 16384 per
slot, ``-np`` one slot per session, its host prompt cache ``--cache-ram`` on by default; the
GGUF's training context overridden to 32768, since llama-server caps a slot at it).
Greedy, 16 output tokens a turn. Build llama-server as ``compare_llama_server.py`` says, then:

    python benchmarks/agentic.py --llama-server /tmp/ls/build/bin/llama-server [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
from rounds import check_rounds, order, paired, paired_text, save, stream_chat  # benchmarks/rounds.py

from glmserve.bench.report import hardware
from glmserve.models import default_model_path
from glmserve.testing import DEFAULT_MODEL, RemoteServer

N_CTX = 16384
MAX_TOKENS = 16
SHARED_TOKENS = 6000  # the system prompt of shared-4 and evicted
OTHER_TOKENS = 3000  # each other session's prompt in evicted
WORDS = ("file", "path", "read", "write", "edit", "search", "pattern", "command", "shell", "output", "line", "range",
         "string", "replace", "directory", "glob", "test", "commit", "branch", "diff", "patch", "function", "class",
         "module", "import", "error", "warning", "timeout", "retry", "cache", "token", "request", "response",
         "schema", "field", "value", "default", "optional", "required", "array", "object", "number", "boolean")


def system_prompt(tokens: int, seed: int) -> str:
    """A coding agent's system prompt of about ``tokens`` tokens: instructions, then tools with
    JSON schemas (deterministic in ``seed``)."""
    rng = random.Random(seed)
    parts = ["You are an interactive coding agent working in the user's repository. Use the tools below; "
             "read files before editing them; keep answers short.\n\n# Tools\n"]
    size, i = 0, 0
    while size < tokens * 4.66:  # SmolLM2's tokenizer: ~4.66 characters a token on this text
        words = " ".join(rng.choice(WORDS) for _ in range(40))
        props = {rng.choice(WORDS) + f"_{j}": {"type": rng.choice(["string", "integer", "boolean"]),
                                                "description": " ".join(rng.choice(WORDS) for _ in range(8))}
                 for j in range(4)}
        tool = {"name": f"tool_{i}", "description": words, "input_schema": {"type": "object", "properties": props}}
        text = json.dumps(tool) + "\n"
        parts.append(text)
        size += len(text)
        i += 1
    return "".join(parts)


def tool_result(seed: int, tokens: int = 400) -> str:
    rng = random.Random(seed)
    lines = [f"{n:4d}  def {rng.choice(WORDS)}_{n}(self, {rng.choice(WORDS)}): return self.{rng.choice(WORDS)}"
             for n in range(tokens // 16)]
    return "Tool result (read_file):\n" + "\n".join(lines)


async def turn(client: httpx.AsyncClient, messages: list[dict]) -> dict:
    """One streamed greedy turn: TTFT (s), its text, prompt and cached tokens (glmserve's usage,
    llama-server's ``timings``)."""
    body = {"model": DEFAULT_MODEL, "messages": messages, "temperature": 0, "max_tokens": MAX_TOKENS,
            "stream": True, "stream_options": {"include_usage": True}}
    r = await stream_chat(client, body)
    usage, timings = r["usage"], r["timings"]
    prompt = usage.get("prompt_tokens") or timings.get("prompt_n", 0) + timings.get("cache_n", 0)
    cached = ((usage.get("prompt_tokens_details") or {}).get("cached_tokens") if "prompt_tokens_details" in usage
              else timings.get("cache_n", 0)) or 0
    ttft = (r["first"] or r["end"]) - r["start"]
    return {"ttft": ttft, "text": r["text"], "prompt": prompt, "cached": cached,
            "prefill_tok_s": (prompt - cached) / ttft if ttft > 0 else 0.0}


def _client(url: str) -> httpx.AsyncClient:
    # a connection per request: llama-server closes kept-alive connections after a few requests
    return httpx.AsyncClient(base_url=url, timeout=1800, limits=httpx.Limits(max_keepalive_connections=0))


async def session(url: str, system: str, task: str, turns: int, seed: int) -> list[dict]:
    """A session's turns: [system, task], then each turn appends the reply and a tool result."""
    messages = [{"role": "system", "content": system}, {"role": "user", "content": task}]
    out = []
    async with _client(url) as client:
        for t in range(turns):
            result = await turn(client, messages)
            out.append(result)
            messages += [{"role": "assistant", "content": result["text"]},
                         {"role": "user", "content": tool_result(seed * 100 + t)}]
    return out


def scenario_single(url: str, tokens: int, seed: int) -> dict:
    turns = asyncio.run(session(url, system_prompt(tokens, seed), "Fix the failing test in tests/test_io.py.", 3,
                                seed))
    return {f"turn {i + 1}": t for i, t in enumerate(turns)}


def scenario_shared(url: str, seed: int, sessions: int = 4) -> dict:
    system = system_prompt(SHARED_TOKENS, seed)

    async def run():
        start = time.perf_counter()
        async with _client(url) as client:
            results = await asyncio.gather(*(turn(client, [{"role": "system", "content": system},
                                                           {"role": "user", "content": f"Subtask {i}: review "
                                                            f"module_{i}.py for {WORDS[i]} errors."}])
                                             for i in range(sessions)))
        return time.perf_counter() - start, results

    wall, results = asyncio.run(run())
    return {"all first tokens": {"ttft": max(r["ttft"] for r in results), "wall": wall,
                                 "prompt": sum(r["prompt"] for r in results),
                                 "cached": sum(r["cached"] for r in results)},
            **{f"session {i + 1}": r for i, r in enumerate(results)}}


def scenario_evicted(url: str, seed: int) -> dict:
    system, task = system_prompt(SHARED_TOKENS, seed), "Fix the failing test in tests/test_io.py."

    async def run():
        async with _client(url) as client:
            messages = [{"role": "system", "content": system}, {"role": "user", "content": task}]
            out = {}
            for t in (1, 2):
                r = await turn(client, messages)
                out[f"A turn {t}"] = r
                messages += [{"role": "assistant", "content": r["text"]},
                             {"role": "user", "content": tool_result(seed * 100 + t)}]
            others = await asyncio.gather(*(turn(client, [{"role": "system", "content": system_prompt(OTHER_TOKENS, seed + k)},
                                                          {"role": "user", "content": task}]) for k in (1, 2)))
            out["others (2 at once)"] = {"ttft": max(o["ttft"] for o in others),
                                         "prompt": sum(o["prompt"] for o in others),
                                         "cached": sum(o["cached"] for o in others)}
            out["A turn 3 (resumed)"] = await turn(client, messages)
            return out

    return asyncio.run(run())


def metric_sum(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(float(v) for v in re.findall(rf"^glmserve:{name}(?:_total)?{{[^}}]*}} (\S+)$", text, re.M))


def scenario_claude_code(url: str, claude: str) -> dict:
    """``claude -p`` twice in one working directory (the second ``--continue``s the first)."""
    out = {}
    with tempfile.TemporaryDirectory() as home:
        # a reply of at most 256 tokens (Claude Code asks for 32000 unless told otherwise)
        env = {**os.environ, "HOME": home, "ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": "x",
               "DISABLE_TELEMETRY": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
               "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "256"}
        for label, extra in (("turn 1", []), ("turn 2 (--continue)", ["--continue"])):
            queries, hits = metric_sum(url, "prefix_cache_queries"), metric_sum(url, "prefix_cache_hits")
            start = time.perf_counter()
            proc = subprocess.run([claude, "-p", "Say hi in three words.", "--model", DEFAULT_MODEL, *extra],
                                  env=env, cwd=home, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=3600)
            wall = time.perf_counter() - start
            prompt = metric_sum(url, "prefix_cache_queries") - queries
            cached = metric_sum(url, "prefix_cache_hits") - hits
            out[label] = {"ttft": wall, "prompt": int(prompt), "cached": int(cached),
                          "answer": (proc.stdout.strip() or proc.stderr.strip())[-120:]}
    return out


def systems(args) -> dict[str, dict]:
    out = {"glmserve": {"args": ()}, "glmserve --batch-invariant": {"args": ("--batch-invariant",)}}
    if args.llama_server:
        out["llama-server"] = {"command": [args.llama_server, "-m", str(default_model_path()), "--host", "127.0.0.1",
                                           "-t", str(args.threads), "-tb", str(args.threads), "--no-webui",
                                           # it caps a slot at the training context (8192 for SmolLM2);
                                           # glmserve's --n-ctx 16384 goes past it as well
                                           "--override-kv", "llama.context_length=int:32768"]}
    return {name: out[name] for name in args.systems if name in out}


SEQS = {"shared-4": 4, "evicted": 2, "claude-code": 1}  # single-*: 1


def single_tokens(scenario: str) -> int | None:
    """The system prompt's tokens of a ``single-N`` scenario (``single-6k``: 6000, ``single-500``)."""
    match = re.fullmatch(r"single-(\d+)(k?)", scenario)
    return None if match is None else int(match.group(1)) * (1000 if match.group(2) else 1)


def start(spec: dict, scenario: str, threads: int) -> RemoteServer:
    seqs = SEQS.get(scenario, 1)
    n_ctx = 32768 if scenario == "claude-code" else N_CTX
    if "command" in spec:  # -c is the whole cache: n_ctx cells per slot
        return RemoteServer(command=[*spec["command"], "-c", str(n_ctx * seqs), "-np", str(seqs)],
                            startup_timeout=120)
    # Claude Code sends no temperature: greedy, as every other scenario
    extra = ("--override-generation-config", '{"temperature": 0}') if scenario == "claude-code" else ()
    return RemoteServer("--n-ctx", str(n_ctx), "--max-num-seqs", str(seqs), *spec["args"], *extra, n_threads=threads)


def run_scenario(name: str, url: str, seed: int, args) -> dict:
    if single_tokens(name) is not None:
        return scenario_single(url, single_tokens(name), seed)
    if name == "shared-4":
        return scenario_shared(url, seed)
    if name == "evicted":
        return scenario_evicted(url, seed)
    return scenario_claude_code(url, args.claude)


def report(results: dict, args) -> tuple[str, dict]:
    """Medians per (scenario, system, step) over the rounds, as a table."""
    lines = [f"hardware: {hardware()} | model: {default_model_path().name} | threads {args.threads} | "
             f"greedy, {MAX_TOKENS} output tokens a turn | {args.rounds} alternating rounds, medians",
             "", "| scenario | system | step | TTFT s (median) | per round | prompt tokens | cached | prefill tok/s |",
             "|---|---|---|---:|---|---:|---:|---:|"]
    stats: dict = {}
    for (scenario, system), rounds in results.items():
        for step in rounds[0]:
            rows = [r[step] for r in rounds]
            ttft = statistics.median(r["ttft"] for r in rows)
            prompt = statistics.median(r["prompt"] for r in rows)
            cached = statistics.median(r["cached"] for r in rows)
            rate = statistics.median(r.get("prefill_tok_s", (r["prompt"] - r["cached"]) / r["ttft"]) for r in rows)
            stats.setdefault(scenario, {}).setdefault(system, {})[step] = {
                "ttft_s": ttft, "rounds": [round(r["ttft"], 2) for r in rows], "prompt": prompt, "cached": cached,
                "prefill_tok_s": rate, **({"answer": rows[-1]["answer"]} if "answer" in rows[-1] else {})}
            lines.append(f"| {scenario} | {system} | {step} | {ttft:.2f} | {[round(r['ttft'], 2) for r in rows]} | "
                         f"{prompt:.0f} | {cached / prompt if prompt else 0:.0%} | {rate:.0f} |")
    lines.append("")
    for (scenario, system), rounds in results.items():
        theirs = results.get((scenario, "llama-server"))
        if system == "llama-server" or theirs is None:
            continue
        for step in rounds[0]:
            ratio = paired([r[step]["ttft"] for r in rounds], [r[step]["ttft"] for r in theirs])
            stats[scenario][system][step]["ttft_vs_llama_server"] = ratio
            lines.append(f"- {scenario}, {step}: TTFT {system} / llama-server {paired_text(ratio)}")
    return "\n".join(lines), stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-server", help="path to the llama-server binary (left out: glmserve only)")
    ap.add_argument("--claude", type=lambda p: str(Path(p).resolve()),
                    help="path to Claude Code's claude command (for the claude-code scenario)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=check_rounds, default=2, help="an even number (ABBA order)")
    ap.add_argument("--scenarios", type=lambda s: s.split(","), default=["single-6k", "single-12k", "shared-4",
                                                                          "evicted"])
    ap.add_argument("--systems", type=lambda s: s.split(","), default=["glmserve", "llama-server"])
    ap.add_argument("--out", default="agentic", help="results/NAME.md and .json")
    args = ap.parse_args()
    specs = systems(args)
    results: dict[tuple[str, str], list[dict]] = {}
    for r in range(args.rounds):
        for scenario in args.scenarios:
            names = list(specs) if scenario != "claude-code" else [n for n in specs if n.startswith("glmserve")]
            names = order(names, r)  # ABBA: each system goes first equally often
            for name in names:
                server = start(specs[name], scenario, args.threads)
                try:
                    results.setdefault((scenario, name), []).append(run_scenario(scenario, server.url, r, args))
                finally:
                    server.stop()
                print(f"round {r + 1} {scenario} {name}: done", flush=True)
    text, stats = report(results, args)
    command = "python benchmarks/agentic.py " + " ".join(
        f"--{k.replace('_', '-')} {','.join(v) if isinstance(v, list) else v}" for k, v in vars(args).items()
        if v is not None and k != "out")
    save(args.out, "Agent-shaped prompts: glmserve vs llama-server", text, stats, command)


if __name__ == "__main__":
    main()
