"""Claude Code sessions started by hand, as a new user would: glmserve against llama.cpp's
``llama-server`` on the same GGUF, in rounds of one run in ABBA order; each session's wall time,
each request's TTFT and cached prompt tokens, and glmserve's session times against
llama-server's as the median of per-round ratios (docs/engineering/measuring.md).

Per round and system: the server is started afresh (the embedded default GGUF, ``--n-ctx``
32768, one sequence, 2 threads, greedy, and the same tool-rendering chat template on both:
``tests/fixtures/templates/chatml-hermes-tools.jinja``, Qwen2.5's layout, given to glmserve as
``--chat-template`` and to llama-server as ``--jinja --chat-template-file``), then Claude Code
runs ``claude -p QUESTION`` twice, one session after the other in one new project folder (as a
user works on one project), as the README's by-hand recipe starts it but for the attribution
switch: a user who has not read that far leaves ``CLAUDE_CODE_ATTRIBUTION_HEADER`` unset, so
each session's system prompt starts with its own attribution line (its 3-character suffix
follows the session's first question). Sessions in two folders differ further in what the model
reads (Claude Code 2.1.330 names the folder in its memory path, ~800 tokens into the system
prompt, and in its environment message), which no cache guard may remove: run that way
(``results/agent_sessions_folder_per_session.md``), the second session's prompt was cached to
its 825th token of 10,100 on glmserve. A reply's ceiling is 256 tokens
(``CLAUDE_CODE_MAX_OUTPUT_TOKENS``) and a session at most ``--max-turns`` model turns, on both
servers alike.

Claude Code talks to the server through a recording proxy in this process, which passes every
byte on and notes each request: its route, the time to its first ``content_block_delta`` (TTFT;
a whole reply: its end), its end, and the usage the server gave (``input_tokens`` computed,
``cache_read_input_tokens`` read from the prefix cache: glmserve reports both; llama-server's
Anthropic stream reports neither, shown as 0 and None). The report compares each session's wall
time, and its first request's TTFT, which is where a cached prompt shows: the rest of a session
depends on what the model answered, which differs once the two servers' prompts differ
(glmserve has removed the attribution line).

Build llama-server as ``compare_llama_server.py`` says (or take ``build/llama-tools/bin/llama-server``,
which ``make test`` builds), install Claude Code (``npm install --prefix DIR
@anthropic-ai/claude-code@2.1.330``), then:

    python benchmarks/agent_sessions.py --llama-server build/llama-tools/bin/llama-server \\
        --claude DIR/node_modules/.bin/claude --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import httpx
import uvicorn
from rounds import check_rounds, order, paired, paired_text, save  # benchmarks/rounds.py
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from glmserve.bench.report import hardware
from glmserve.models import default_model_path
from glmserve.testing import DEFAULT_MODEL, RemoteServer, free_port

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "tests" / "fixtures" / "templates" / "chatml-hermes-tools.jinja"
N_CTX = 32768
MAX_OUTPUT_TOKENS = 256
QUESTIONS = ("What does a hash map do? Answer in one sentence.",
             "Name three uses of a queue. Answer in one sentence.")
HOP_BY_HOP = {"host", "content-length", "transfer-encoding", "connection", "accept-encoding", "content-encoding",
              "keep-alive"}


def usage_of(body: bytes) -> dict:
    """The Anthropic ``usage`` of a reply: a whole one's, or a stream's ``message_start`` usage
    updated by its ``message_delta`` usage (the final counts). Empty when there is none."""
    text = body.decode("utf-8", errors="replace")
    if not text.lstrip().startswith(("event:", "data:")):
        try:
            data = json.loads(text)
        except ValueError:
            return {}
        return data.get("usage") or {} if isinstance(data, dict) else {}
    usage: dict = {}
    for line in text.splitlines():
        if not line.startswith("data:"):
            continue
        try:
            event = json.loads(line[5:])
        except ValueError:
            continue
        if event.get("type") == "message_start":
            usage.update(event.get("message", {}).get("usage") or {})
        elif event.get("type") == "message_delta":
            usage.update({k: v for k, v in (event.get("usage") or {}).items() if v is not None})
    return usage


class Recorder:
    """A proxy to ``upstream`` that notes each request (``requests``), labelled with ``session``
    (set between sessions)."""

    def __init__(self) -> None:
        self.upstream = ""
        self.session = ""
        self.requests: list[dict] = []
        self._client = httpx.AsyncClient(timeout=None)
        self.app = Starlette(routes=[Route("/{path:path}", self._forward,
                                           methods=["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS"])])

    async def _forward(self, request: Request) -> StreamingResponse:
        body = await request.body()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        url = self.upstream + request.url.path + (f"?{request.url.query}" if request.url.query else "")
        sent = time.perf_counter()
        upstream = await self._client.send(self._client.build_request(request.method, url, headers=headers,
                                                                      content=body), stream=True)
        record = {"session": self.session, "route": request.url.path, "status": upstream.status_code, "ttft": None}

        async def relay():
            seen = bytearray()
            try:
                async for chunk in upstream.aiter_raw():
                    if record["ttft"] is None and b"content_block_delta" in chunk:
                        record["ttft"] = time.perf_counter() - sent
                    seen += chunk
                    yield chunk
            finally:
                await upstream.aclose()
                record["wall"] = time.perf_counter() - sent
                record["ttft"] = record["ttft"] if record["ttft"] is not None else record["wall"]
                usage = usage_of(bytes(seen))
                record["input"], record["cached"] = usage.get("input_tokens"), usage.get("cache_read_input_tokens")
                self.requests.append(record)

        return StreamingResponse(relay(), status_code=upstream.status_code,
                                 headers={k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP})


def serve_proxy(recorder: Recorder) -> str:
    """The proxy on a free loopback port, in a thread of this process; its URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(recorder.app, host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return f"http://127.0.0.1:{port}"


def session(claude: str, proxy: str, home: Path, project: Path, question: str, max_turns: int) -> dict:
    """One ``claude -p`` session in ``project``, a folder of ``home``: its wall time and answer."""
    names = ("ANTHROPIC_MODEL", "ANTHROPIC_DEFAULT_HAIKU_MODEL", "ANTHROPIC_DEFAULT_SONNET_MODEL",
             "ANTHROPIC_DEFAULT_OPUS_MODEL", "CLAUDE_CODE_SUBAGENT_MODEL")
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "ANTHROPIC_BASE_URL": proxy, "ANTHROPIC_API_KEY": "unused",
           **dict.fromkeys(names, DEFAULT_MODEL), "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
           "DISABLE_TELEMETRY": "1", "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(MAX_OUTPUT_TOKENS),
           "CLAUDE_CODE_AUTO_COMPACT_WINDOW": str(N_CTX)}
    start = time.perf_counter()
    proc = subprocess.run([claude, "-p", question, "--max-turns", str(max_turns)], env=env, cwd=project,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=3600)
    return {"wall": time.perf_counter() - start, "exit": proc.returncode,
            "answer": (proc.stdout.strip() or proc.stderr.strip())[-160:]}


def systems(args) -> dict[str, list[str] | tuple[str, ...]]:
    """{label: glmserve's serve flags (a tuple) or llama-server's command (a list)}."""
    return {
        "glmserve": ("--n-ctx", str(N_CTX), "--max-num-seqs", "1", "--chat-template", str(TEMPLATE),
                     "--override-generation-config", '{"temperature": 0}'),
        "llama-server": [args.llama_server, "-m", str(default_model_path()), "--host", "127.0.0.1",
                         "-t", str(args.threads), "-tb", str(args.threads), "-c", str(N_CTX), "-np", "1",
                         "--jinja", "--chat-template-file", str(TEMPLATE), "--temp", "0", "--no-webui",
                         # it caps a slot at the GGUF's training context (8192 for SmolLM2)
                         "--override-kv", "llama.context_length=int:32768"],
    }


def run_system(spec, recorder: Recorder, proxy: str, args) -> dict:
    """Both sessions against a server started for them; {session: wall, answer, requests}."""
    if isinstance(spec, list):
        server = RemoteServer(command=spec, startup_timeout=120)
    else:
        server = RemoteServer(*spec, n_threads=args.threads)
    home = Path(tempfile.mkdtemp(prefix="agent-home-"))
    project = Path(tempfile.mkdtemp(prefix="project-", dir=home))
    out = {}
    try:
        recorder.upstream = server.url
        for i, question in enumerate(QUESTIONS, 1):
            recorder.session, first = f"session {i}", len(recorder.requests)
            out[f"session {i}"] = {**session(args.claude, proxy, home, project, question, args.max_turns),
                                   "requests": recorder.requests[first:]}
    finally:
        server.stop()
        shutil.rmtree(home, ignore_errors=True)
    return out


def _first(session: dict) -> dict:
    """A session's first ``/v1/messages`` request's record ({} when it made none)."""
    return next((q for q in session["requests"] if q["route"] == "/v1/messages"), {"ttft": float("nan")})


def report(results: dict[str, list[dict]], args) -> tuple[str, dict]:
    """Per system and session: wall time and requests (medians over rounds, each round's value),
    then glmserve / llama-server per session as the median of per-round ratios."""
    lines = [f"hardware: {hardware()} | model: {default_model_path().name} | threads {args.threads} | "
             f"n_ctx {N_CTX} | Claude Code, greedy, replies of at most {MAX_OUTPUT_TOKENS} tokens, "
             f"at most {args.max_turns} turns | {args.rounds} alternating rounds, medians", "",
             "| system | session | wall s (median) | per round | requests | first request: prompt tokens, cached, "
             "TTFT s |", "|---|---|---:|---|---:|---|"]
    stats: dict = {}
    for system, rounds in results.items():
        for name in rounds[0]:
            walls = [r[name]["wall"] for r in rounds]
            firsts = [_first(r[name]) for r in rounds]
            stats.setdefault(system, {})[name] = {
                "wall_s": statistics.median(walls), "rounds": [round(w, 1) for w in walls],
                "requests": [r[name]["requests"] for r in rounds], "answers": [r[name]["answer"] for r in rounds],
                "exits": [r[name]["exit"] for r in rounds]}
            first = "; ".join(f"{(q.get('input') or 0) + (q.get('cached') or 0)}, {q.get('cached')}, "
                              f"{q.get('ttft', 0):.1f}" for q in firsts)
            lines.append(f"| {system} | {name} | {statistics.median(walls):.1f} | {[round(w, 1) for w in walls]} | "
                         f"{statistics.median(len(r[name]['requests']) for r in rounds):.0f} | {first} |")
    lines.append("")
    if "glmserve" in results and "llama-server" in results:
        for name in results["glmserve"][0]:
            ratio = paired([r[name]["wall"] for r in results["glmserve"]],
                           [r[name]["wall"] for r in results["llama-server"]])
            stats["glmserve"][name]["wall_vs_llama_server"] = ratio
            lines.append(f"- {name}: wall time glmserve / llama-server {paired_text(ratio)}")
            firsts = {system: [_first(r[name])["ttft"] for r in results[system]] for system in ("glmserve", "llama-server")}
            ratio = paired(firsts["glmserve"], firsts["llama-server"])
            stats["glmserve"][name]["first_ttft_vs_llama_server"] = ratio
            lines.append(f"- {name}: first request's TTFT glmserve / llama-server {paired_text(ratio)}")
    return "\n".join(lines), stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-server", required=True, help="path to the llama-server binary")
    ap.add_argument("--claude", required=True, type=lambda p: str(Path(p).resolve()),
                    help="path to Claude Code's claude command")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=check_rounds, default=2, help="an even number (ABBA order)")
    ap.add_argument("--max-turns", type=int, default=3, help="Claude Code's --max-turns for each session")
    ap.add_argument("--out", default="agent_sessions", help="results/NAME.md and .json")
    args = ap.parse_args()
    specs = systems(args)
    recorder = Recorder()
    proxy = serve_proxy(recorder)
    results: dict[str, list[dict]] = {}
    for r in range(args.rounds):
        for name in order(list(specs), r):  # ABBA: each system goes first equally often
            results.setdefault(name, []).append(run_system(specs[name], recorder, proxy, args))
            walls = {s: round(v["wall"], 1) for s, v in results[name][-1].items()}
            print(f"round {r + 1} {name}: {walls}", flush=True)
    text, stats = report(results, args)
    print(text)
    command = (f"python benchmarks/agent_sessions.py --llama-server {args.llama_server} --claude {args.claude} "
               f"--threads {args.threads} --rounds {args.rounds} --max-turns {args.max_turns}")
    save(args.out, "Claude Code sessions by hand: glmserve vs llama-server", text, stats, command)


if __name__ == "__main__":
    main()
