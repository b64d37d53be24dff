"""Speculative decoding (``--speculative ngram``, and ``--speculative draft`` with
``--draft-model``) against decoding without it and against llama.cpp's C++ ``llama-server`` with
its own speculation, in balanced rounds of one run; prints medians over the rounds and the
issue's targets, each comparison the median of per-round ratios (docs/engineering/measuring.md).

Systems (the embedded default GGUF, the same threads, 8 parallel sequences, 4096 tokens each):
- ``glmserve``: ``glmserve serve`` as shipped (no speculation);
- ``glmserve --speculative ngram``: its n-gram drafts, default ``--spec-ngram-min/max`` and
  ``--spec-draft-max``;
- ``llama-server --spec-type ngram-simple`` (if ``--llama-server`` is given): llama.cpp's
  prompt-lookup drafts (its "ngram-simple": the last ``--spec-ngram-simple-size-n`` tokens
  looked up in the context, drafting up to ``size-m`` tokens; its defaults), ``-np 8 -c 32768
  --no-kv-unified`` so each slot has 4096 cells too. Built from the llama-cpp-python source
  package glmserve uses (see ``compare_llama_server.py`` for the commands);
- ``llama-server`` without speculation, only when named in ``--systems``;
- with ``--compare-src DIR``: ``glmserve --speculative ngram`` from another checkout's sources
  (``PYTHONPATH=DIR``), to measure a change to speculation against the code before it;
- with ``--draft-model PATH``: ``glmserve --speculative draft --draft-model PATH`` and
  ``llama-server --spec-type draft-simple -md PATH`` with the same draft length (16) and
  probability floor (``--spec-draft-p-min 0.75``, glmserve's ``P_MIN``). With the embedded model
  as its own draft (no smaller GGUF of its vocabulary is at hand here) it shows what the draft
  machinery costs, not a speed-up.

Workloads (greedy, each request's own prompt, up to ``--max-tokens``):
- ``grounded``: input-grounded edits: rewrite a ~300-token Python class with the class renamed,
  or repeat a JSON document with one field changed;
- ``natural``: open questions (short stories, explanations), where drafts find little;
- three kinds that do not copy their input, where n-gram drafts are mostly rejected and
  speculation must not lose (``--speculative ngram`` at most 3% slower): ``paraphrase`` (retell
  a ~250-word passage in other words: the input's phrases recur, their continuations do not),
  ``translate`` (the Python class rewritten in JavaScript: identifiers recur, the syntax
  around them changes), ``explain`` (explain what the class or JSON document is for); and
  ``sampled``, the ``natural`` questions at temperature 1 (seeded), where the small model's
  answers rarely repeat themselves;
- ``repeated``: the ``paraphrase`` requests sent once untimed, then timed again (a retried or
  repeated generation: what n-gram statistics kept across requests, llama-server's
  ``ngram-mod``, are for).

Each round starts each system in turn (ABBA order: ``rounds.order``), runs every workload at
each concurrency (``max(4, 2 c)`` requests, ``c`` in flight), reads the draft acceptance
(glmserve: ``/metrics``; llama-server: each response's ``timings.draft_n`` /
``draft_n_accepted``), and stops it. Output tok/s is generated tokens over the level's wall
time (prefill included); decode tok/s is each request's tokens after its first over the time
from its first token to its last (speculation changes only this part; the median request);
TTFT is per request (streaming).

``--paired`` runs the systems side by side instead, each request sent to every system in turn
(one request at a time), and compares the decode time per token of the same request: on a
shared, noisy machine this tells a few percent apart, which rounds minutes apart cannot.

    python benchmarks/speculative.py [--llama-server build/bin/llama-server] [--rounds 4]
        [--draft-model PATH] [--systems NAME,...] [--paired] [--out NAME]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import statistics
import sys
import time

import httpx
from rounds import check_rounds, order, paired_text, save, stream_chat  # noqa: I001
from rounds import paired as paired_ratios  # noqa: I001

from glmserve.bench.report import hardware
from glmserve.models import default_model_path
from glmserve.testing import DEFAULT_MODEL, RemoteServer

WORDS = ["alpha", "bravo", "delta", "echo", "kilo", "lima", "oscar", "sierra", "tango", "victor", "zulu",
         "orbit", "ember", "quartz", "maple", "cobalt", "harbor", "willow", "falcon", "saffron"]
TOPICS = ["a lighthouse keeper who finds a map", "why the sky is blue", "how bread rises", "a robot learning to "
          "paint", "the history of the bicycle", "how volcanoes form", "a cat that guards a library",
          "why we dream", "the first voyage to the moon", "how bees make honey", "a city under the sea",
          "how rainbows form", "a dragon who is afraid of heights", "how compasses work", "a letter to the future",
          "why leaves change colour"]


CLASS_TEMPLATE = '''import json
from pathlib import Path


class {cls}:
    """{things} kept in a JSON file, by name."""

    def __init__(self, path):
        self.path = Path(path)
        self.{attr} = {{}}
        if self.path.exists():
            self.{attr} = json.loads(self.path.read_text())

    def add(self, name, count=1):
        self.{attr}[name] = self.{attr}.get(name, 0) + count
        self.save()

    def remove(self, name, count=1):
        left = self.{attr}.get(name, 0) - count
        if left < 0:
            raise ValueError(f"only {{self.{attr}.get(name, 0)}} {{name}} in the {where}")
        self.{attr}[name] = left
        self.save()

    def total(self):
        return sum(self.{attr}.values())

    def save(self):
        self.path.write_text(json.dumps(self.{attr}, indent={indent}, sort_keys=True))
'''
CLASSES = [("Inventory", "Items in stock", "items", "store"), ("Library", "Books on loan", "books", "library"),
           ("Garage", "Spare parts", "parts", "garage"), ("Pantry", "Food supplies", "supplies", "pantry"),
           ("Wardrobe", "Clothes", "clothes", "wardrobe"), ("Toolbox", "Tools", "tools", "toolbox")]


def code_prompt(rng: random.Random) -> str:
    """A ~300-token Python class (the code first, then the change asked for: the SmolLM2-135M
    model copies a realistic class, but not a list of near-identical functions)."""
    cls, things, attr, where = rng.choice(CLASSES)
    code = CLASS_TEMPLATE.format(cls=cls, things=things, attr=attr, where=where, indent=rng.choice([2, 4]))
    return f"```python\n{code}```\n\nRename {cls} to {rng.choice(WORDS).title()}{cls} in this code. Output the whole code."


def json_prompt(rng: random.Random) -> str:
    doc = {"id": rng.randrange(10**6), "name": rng.choice(WORDS).title() + " " + rng.choice(WORDS).title(),
           "email": f"{rng.choice(WORDS)}@example.com", "active": rng.random() < 0.5,
           "roles": rng.sample(["admin", "editor", "viewer", "owner", "billing"], 3),
           "address": {"street": f"{rng.randrange(1, 999)} {rng.choice(WORDS).title()} Street",
                       "city": rng.choice(WORDS).title(), "zip": f"{rng.randrange(10000, 99999)}"},
           "limits": {"requests_per_minute": rng.choice([60, 120, 600]), "max_tokens": rng.choice([512, 1024])},
           "tags": rng.sample(WORDS, 4)}
    return (f"Repeat this JSON document exactly, changing only the city to {rng.choice(WORDS).title()}. Output "
            f"only the JSON.\n\n" + json.dumps(doc, indent=2))


PASSAGES = [
    "The town of Ashford sits where two rivers meet, and for most of its history it lived from the mills "
    "that the water turned. In the early years the mills ground grain for the farms of the valley; later "
    "they spun wool, and the town grew around the long stone buildings by the river. When the railway came, "
    "the wool could be sent to the cities in a day instead of a week, and for fifty years Ashford was busy "
    "and proud. Then cheaper cloth arrived from abroad, the mills closed one after another, and the young "
    "people left to find work elsewhere. Today the mill buildings hold a museum, a school of music and small "
    "workshops, and visitors come in summer to walk along the rivers and see the old water wheels turn again.",
    "Honey bees live in colonies of tens of thousands of workers, a few hundred males and a single queen. "
    "The workers do almost everything: they clean the cells, feed the young, build comb from wax made in "
    "their own bodies, guard the entrance and, in the last weeks of their short lives, fly out to collect "
    "nectar and pollen. A forager that finds a rich patch of flowers returns and dances on the comb; the "
    "angle of the dance tells the others the direction of the flowers relative to the sun, and its length "
    "tells them the distance. Nectar is passed from bee to bee, mixed with enzymes and stored in open cells, "
    "where the bees fan it with their wings until enough water has gone and it has become honey.",
    "A compass needle is a small magnet that can turn freely. The Earth itself behaves like a huge, weak "
    "magnet, with a field that runs roughly from the south of the planet to the north, and the needle lines "
    "up with that field. The end that points north is therefore attracted to what is, magnetically, a south "
    "pole, which is one of the small puzzles of the subject. The magnetic poles are not in the same places "
    "as the geographic ones and they move slowly over the years, so navigators correct their readings with "
    "tables of the difference, called declination. Iron in a ship or a car can pull the needle aside too, "
    "which is why ships' compasses sit in a housing with small correcting magnets around them.",
]


def prompts(workload: str, n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    if workload == "grounded":
        return [(code_prompt if i % 2 == 0 else json_prompt)(rng) for i in range(n)]
    if workload in ("paraphrase", "repeated"):
        return [f"{PASSAGES[(seed + i) % len(PASSAGES)]}\n\nRetell this passage in your own words, in a different "
                f"order, without quoting it." for i in range(n)]
    if workload == "translate":
        return [code_prompt(rng).rsplit("\n\n", 1)[0] + "\n\nRewrite this class in JavaScript." for _ in range(n)]
    if workload == "explain":
        return [(code_prompt(rng).rsplit("\n\n", 1)[0] if i % 2 == 0 else json_prompt(rng).split("\n\n", 1)[1])
                + "\n\nExplain what this is for and how it works, in plain words." for i in range(n)]
    return [f"Write a few paragraphs about {rng.choice(TOPICS)}." for _ in range(n)]


async def one(client: httpx.AsyncClient, model: str, prompt: str, max_tokens: int, seed: int | None) -> dict:
    """One streamed request: greedy, or at temperature 1 with ``seed``."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "temperature": 0,
            "max_tokens": max_tokens, "stream": True, "stream_options": {"include_usage": True}}
    if seed is not None:
        body.update(temperature=1.0, seed=seed)
    r = await stream_chat(client, body)
    first, end, timings = r["first"], r["end"], r["timings"]
    tokens = r["usage"].get("completion_tokens") or timings.get("predicted_n", 0)
    return {"ttft": (first or end) - r["start"], "tokens": tokens,
            "decode_tok_s": (tokens - 1) / (end - first) if first is not None and tokens > 1 and end > first else None,
            "draft": (timings.get("draft_n", 0), timings.get("draft_n_accepted", 0))}


async def level(url: str, model: str, texts: list[str], c: int, max_tokens: int,
                sampled: bool = False) -> tuple[float, list[dict]]:
    sem = asyncio.Semaphore(c)
    # a connection per request: llama-server (cpp-httplib) closes kept-alive connections after a
    # few requests, and a request sent on one just closed fails ("Server disconnected")
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=httpx.Limits(max_keepalive_connections=0)) as client:
        async def run(i: int, text: str) -> dict:
            async with sem:
                return await one(client, model, text, max_tokens, i if sampled else None)

        start = time.perf_counter()
        results = await asyncio.gather(*(run(i, t) for i, t in enumerate(texts)))
        return time.perf_counter() - start, results


def spec_counters(url: str) -> tuple[float, float]:
    """glmserve's (draft tokens, accepted tokens) so far; (0, 0) without speculation."""
    text = httpx.get(f"{url}/metrics").text
    def value(name: str) -> float:
        return sum(float(m) for m in re.findall(rf"^glmserve:{name}_total{{[^}}]*}} (\S+)$", text, re.M))
    return value("spec_decode_num_draft_tokens"), value("spec_decode_num_accepted_tokens")


def systems(args) -> dict[str, dict]:
    glm = ("--max-num-seqs", "8", "--n-ctx", "4096", "--max-queue", "1024")
    out = {"glmserve": {"args": glm}, "glmserve --speculative ngram": {"args": (*glm, "--speculative", "ngram")}}
    if args.compare_src:  # another checkout's glmserve, e.g. before a change
        out[f"glmserve ({args.compare_src}) --speculative ngram"] = {
            "args": (*glm, "--speculative", "ngram"), "env": {"PYTHONPATH": args.compare_src}}
    if args.llama_server:
        plain = [args.llama_server, "-m", str(default_model_path()), "--host", "127.0.0.1", "-t", str(args.threads),
                 "-tb", str(args.threads), "-c", "32768", "-np", "8", "--no-kv-unified", "--no-webui"]
        out["llama-server --spec-type ngram-simple"] = {"command": [*plain, "--spec-type", "ngram-simple"]}
        out["llama-server"] = {"command": plain}  # no speculation: what its own speculation gains
        # n-gram statistics shared across slots and requests (its defaults: 24-token match, drafts of 48 to 64)
        out["llama-server --spec-type ngram-mod"] = {"command": [*plain, "--spec-type", "ngram-mod"]}
    if args.draft_model:
        out["glmserve --speculative draft"] = {"args": (*glm, "--speculative", "draft", "--draft-model",
                                                        args.draft_model)}
        if args.llama_server:
            out["llama-server --spec-type draft-simple"] = {"command": [
                *plain, "--spec-type", "draft-simple",
                "-md", args.draft_model, "--spec-draft-n-max", "16", "--spec-draft-p-min", "0.75",
                "-td", str(args.threads), "-tbd", str(args.threads)]}
    if args.systems:
        return {name: out[name] for name in args.systems}
    return {name: spec for name, spec in out.items()  # on request only
            if name not in ("llama-server", "llama-server --spec-type ngram-mod")}


def start(spec: dict, threads: int) -> RemoteServer:
    return (RemoteServer(command=spec["command"], startup_timeout=120) if "command" in spec
            else RemoteServer(*spec["args"], n_threads=threads, env=spec.get("env")))


def paired(args, specs: dict[str, dict]) -> None:
    """``--paired``: every system runs at once, idle but for the request it is sent; each request
    goes to every system in turn (ABBA order from request to request), one at a time, so
    that the machine's load changes between the systems' answers to the same request far less
    than between rounds. Reports, per workload, each system's decode tok/s and the median over
    requests of its decode time per token against the first system's for the same request."""
    names = list(specs)
    servers = {}
    try:
        for name in names:
            servers[name] = start(specs[name], args.threads)
        runs = {name: {w: [] for w in args.workloads} for name in names}
        counters = {name: {w: [0.0, 0.0] for w in args.workloads} for name in names}

        async def send(name: str, text: str, seed: int | None) -> dict:
            url = servers[name].url
            async with httpx.AsyncClient(base_url=url, timeout=600,
                                         limits=httpx.Limits(max_keepalive_connections=0)) as client:
                return await one(client, DEFAULT_MODEL, text, args.max_tokens, seed)

        turn = 0
        for r in range(args.rounds):
            for w in args.workloads:
                texts = prompts(w, 4, seed=1000 * r + 1)
                seeds = [i if w == "sampled" else None for i in range(len(texts))]
                if w == "repeated":  # the same requests once before: a retried generation
                    for name in names:
                        for text, seed in zip(texts, seeds):
                            asyncio.run(send(name, text, seed))
                for text, seed in zip(texts, seeds):
                    turn += 1
                    for name in order(names, turn - 1):
                        before = spec_counters(servers[name].url) if "args" in specs[name] else (0, 0)
                        result = asyncio.run(send(name, text, seed))
                        after = spec_counters(servers[name].url) if "args" in specs[name] else (0, 0)
                        counters[name][w][0] += after[0] - before[0] + result["draft"][0]
                        counters[name][w][1] += after[1] - before[1] + result["draft"][1]
                        runs[name][w].append(result)
    finally:
        for server in servers.values():
            server.stop()
    base = names[0]
    lines = [f"| workload | system | decode tok/s (median request) | decode time per token vs {base}, same "
             "request (median) | per-request ratios | draft acceptance | generated tokens |",
             "|---|---|---:|---:|---|---:|---:|"]
    stats: dict = {}
    for w in args.workloads:
        for name in names:
            rs, bs = runs[name][w], runs[base][w]
            ratios = [b["decode_tok_s"] / x["decode_tok_s"] for x, b in zip(rs, bs)
                      if x["decode_tok_s"] and b["decode_tok_s"]]
            drafted, accepted = counters[name][w]
            m = stats.setdefault(name, {})[w] = {
                "decode_tok_s": statistics.median(x["decode_tok_s"] for x in rs if x["decode_tok_s"]),
                "time_per_token_vs_base": statistics.median(ratios), "ratios": [round(x, 3) for x in ratios],
                "acceptance": accepted / drafted if drafted else None, "tokens": sum(x["tokens"] for x in rs)}
            acc = "-" if m["acceptance"] is None else f"{m['acceptance']:.0%}"
            lines.append(f"| {w} | {name} | {m['decode_tok_s']:.1f} | {m['time_per_token_vs_base']:.3f} | "
                         f"{m['ratios']} | {acc} | {m['tokens']} |")
    report = "\n".join([
        f"hardware: {hardware()} | model: SmolLM2-135M-Instruct Q4_1 (embedded default) | threads {args.threads} | "
        f"max_tokens {args.max_tokens}, streaming, one request at a time | 4 requests per workload and round, "
        f"{args.rounds} rounds, each request sent to every system in turn (paired) | a ratio below 1 is faster "
        f"than {base}", "", *lines])
    save(args.out or "speculative-paired", "Speculative decoding, paired requests", report, stats,
         command=" ".join(["python", "benchmarks/speculative.py", *sys.argv[1:]]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-server", help="path to the llama-server binary (left out: glmserve only)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8])
    ap.add_argument("--max-tokens", type=int, default=400)
    ap.add_argument("--rounds", type=check_rounds, default=4, help="an even number (ABBA order)")
    ap.add_argument("--workloads", type=lambda s: s.split(","), default=["grounded", "natural"],
                    help="comma-separated: grounded, natural, paraphrase, translate, explain, sampled, repeated")
    ap.add_argument("--paired", action="store_true", help="all systems at once, each request sent to each in "
                    "turn, one at a time (--concurrency is not used)")
    ap.add_argument("--compare-src", metavar="DIR", help="adds glmserve --speculative ngram run from the "
                    "package sources in DIR (another checkout's src/, e.g. `git archive` of an earlier commit)")
    ap.add_argument("--out", help="results/OUT.md and .json (default: speculative, or speculative-draft)")
    ap.add_argument("--draft-model", help="a draft GGUF: adds glmserve --speculative draft (and llama-server's "
                    "draft-simple with --llama-server)")
    ap.add_argument("--systems", type=lambda s: s.split(","),
                    help="comma-separated system names to run (default: all; 'glmserve' first, it is the baseline)")
    args = ap.parse_args()
    specs = systems(args)
    if args.paired:
        paired(args, specs)
        return
    names = list(specs)
    workloads = args.workloads
    runs: dict = {name: {w: {c: [] for c in args.concurrency} for w in workloads} for name in names}
    for r in range(args.rounds):
        for name in order(names, r):
            spec = specs[name]
            server = start(spec, args.threads)
            try:
                for w in workloads:
                    for c in args.concurrency:
                        texts = prompts(w, max(4, 2 * c), seed=1000 * r + c)
                        if w == "repeated":  # the same requests once before: a retried generation
                            asyncio.run(level(server.url, DEFAULT_MODEL, texts, c, args.max_tokens))
                        before = spec_counters(server.url) if "args" in spec else (0, 0)
                        wall, results = asyncio.run(level(server.url, DEFAULT_MODEL, texts, c, args.max_tokens,
                                                          sampled=w == "sampled"))
                        after = spec_counters(server.url) if "args" in spec else (0, 0)
                        drafted = after[0] - before[0] + sum(x["draft"][0] for x in results)
                        accepted = after[1] - before[1] + sum(x["draft"][1] for x in results)
                        runs[name][w][c].append({
                            "tok_s": sum(x["tokens"] for x in results) / wall,
                            "ttft_ms": statistics.median(x["ttft"] for x in results) * 1000,
                            "decode_tok_s": statistics.median(x["decode_tok_s"] for x in results
                                                              if x["decode_tok_s"] is not None),
                            "tokens": sum(x["tokens"] for x in results),
                            "acceptance": accepted / drafted if drafted else None})
            finally:
                server.stop()
    stats = {name: {w: {c: {"output_tok_s": statistics.median(x["tok_s"] for x in rs),
                            "rounds": [round(x["tok_s"], 1) for x in rs],
                            "ttft_p50_ms": statistics.median(x["ttft_ms"] for x in rs),
                            "decode_tok_s": statistics.median(x["decode_tok_s"] for x in rs),
                            "tokens": [x["tokens"] for x in rs],
                            "acceptance": (statistics.median(a) if (a := [x["acceptance"] for x in rs
                                                                          if x["acceptance"] is not None]) else None)}
                        for c, rs in by_c.items()} for w, by_c in by_w.items()} for name, by_w in runs.items()}
    lines = ["| workload | concurrency | system | output tok/s (median) | per round | decode tok/s per request "
             "(median) | TTFT p50 ms | draft acceptance | generated tokens per round |",
             "|---|---:|---|---:|---|---:|---:|---:|---|"]
    for w in workloads:
        for c in args.concurrency:
            for name in names:
                m = stats[name][w][c]
                acc = "-" if m["acceptance"] is None else f"{m['acceptance']:.0%}"
                lines.append(f"| {w} | {c} | {name} | {m['output_tok_s']:.1f} | {m['rounds']} | "
                             f"{m['decode_tok_s']:.1f} | {m['ttft_p50_ms']:.0f} | {acc} | {m['tokens']} |")
    checks = []
    for method, theirs in (("ngram", "ngram-simple"), ("draft", "draft-simple")):
        spec, other = stats.get(f"glmserve --speculative {method}"), stats.get(f"llama-server --spec-type {theirs}")
        if spec is None:
            continue
        for w in workloads:
            for c in args.concurrency:
                line = f"- {w}, c={c}: --speculative {method}"
                ours = runs[f"glmserve --speculative {method}"][w][c]
                for against, label in (("glmserve", "no speculation"), (f"llama-server --spec-type {theirs}",
                                                                         f"llama-server's {theirs}")):
                    if against in runs:
                        out, dec = (paired_ratios([x[k] for x in ours], [x[k] for x in runs[against][w][c]])
                                    for k in ("tok_s", "decode_tok_s"))
                        line += f"; / {label}: output {paired_text(out)}, decode {paired_text(dec)}"
                checks.append(line.replace(f"{method}; /", f"{method} /", 1))
    checks.append("- targets: grounded c=1 >= 1.5x without speculation and >= llama-server's speculation; "
                  "natural, paraphrase, translate, explain, sampled >= 0.97x without speculation (decode tok/s: "
                  "greedy answers past 256 tokens may differ in length); repeated faster than without")
    report = "\n".join([
        f"hardware: {hardware()} | model: SmolLM2-135M-Instruct Q4_1 (embedded default) | threads {args.threads} | "
        f"8 parallel sequences, 4096 tokens each | greedy, max_tokens {args.max_tokens}, streaming | max(4, 2c) "
        f"requests per level | {args.rounds} rounds in ABBA order, medians; ratios: the median of per-round ratios", "", *lines, "", *checks])
    save(args.out or ("speculative-draft" if args.draft_model else "speculative"),
         "Speculative decoding: glmserve with and without --speculative, and llama-server", report, stats, command=" ".join(["python", "benchmarks/speculative.py", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
