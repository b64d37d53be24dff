"""``glmserve launch claude|codex|opencode [SERVE FLAGS] [-- AGENT ARGS]``: a coding agent run
against glmserve, set up as each agent needs (after Ollama's ``ollama launch``).

The server: ``--url URL`` reuses a running one; otherwise one is started with the ``serve``
flags given (``glmserve serve ... --port FREE``, its log in ``launch-PORT.log`` under
``--state-dir``), serving the model's own context (``--n-ctx 0``: its training context, cut to
what fits this machine) unless ``--n-ctx`` or ``GLMSERVE_N_CTX`` set one (a ``--config`` entry's
own ``n_ctx`` holds for its model), and stopped when the agent exits. The context the server
advertises (``max_model_len``) is printed, with a warning below ``AGENT_CONTEXT`` (the agents'
own prompts are 9k to 20k tokens), and given to the agent. The agent, found on the ``PATH`` (a
one-line error names its npm package when it is not), is pointed at the server's first model:

- ``claude`` (Claude Code, Anthropic's Messages API): ``ANTHROPIC_BASE_URL``, the key in
  ``ANTHROPIC_API_KEY``, the model for every role (``ANTHROPIC_MODEL``, the Haiku/Sonnet/Opus
  defaults, sub-agents), non-essential traffic off, and its attribution header off
  (``CLAUDE_CODE_ATTRIBUTION_HEADER=0``: it changes the system prompt on every request, so no
  prefix cache would ever match); the context as its auto-compact window
  (``CLAUDE_CODE_AUTO_COMPACT_WINDOW``) and a reply's ceiling (``CLAUDE_CODE_MAX_OUTPUT_TOKENS``),
  and a prompt over it answered with the 400 it compacts on (``prompt is too long``);
- ``codex`` (Codex CLI, the Responses API): a provider with ``wire_api = "responses"`` in a
  ``config.toml`` of a temporary ``CODEX_HOME``, the key in ``GLMSERVE_API_KEY``, the context as
  ``model_context_window`` and compaction at 9/10 of it (``model_auto_compact_token_limit``);
- ``opencode`` (OpenCode, chat completions): an ``@ai-sdk/openai-compatible`` provider in a
  temporary config file (``OPENCODE_CONFIG``), the model's ``limit.context`` and ``limit.output``.

A reply's ceiling is ``output_limit``: a quarter of the context, at most 32768 tokens.

Exit status: the agent's, or 1 with a one-line error."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from glmserve.testing import free_port

AGENT_CONTEXT = 32768  # tokens a coding agent's session needs (its own prompt: 9k-20k)
START_TIMEOUT_S = 1800.0  # a model fetched by name at its first start can take this long


@dataclass(frozen=True)
class Agent:
    command: str
    package: str  # its npm package


AGENTS = {"claude": Agent("claude", "@anthropic-ai/claude-code"), "codex": Agent("codex", "@openai/codex"),
          "opencode": Agent("opencode", "opencode-ai")}


class LaunchError(Exception):
    """Why the agent cannot be launched, in one line."""


def split_args(args: list[str]) -> tuple[str | None, list[str], list[str]]:
    """``(--url, serve flags, agent args)`` of the words after the agent's name."""
    serve, agent = (args[:args.index("--")], args[args.index("--") + 1:]) if "--" in args else (args, [])
    url = None
    if "--url" in serve:
        at = serve.index("--url")
        if at + 1 >= len(serve):
            raise LaunchError("--url needs a URL")
        url, serve = serve[at + 1].rstrip("/"), serve[:at] + serve[at + 2:]
    return url, serve, agent


def output_limit(context: int) -> int:
    """A reply's ceiling in tokens for a ``context``-token window: a quarter of it, at most 32768."""
    return min(context // 4, 32768)


def agent_setup(name: str, url: str, model: str, key: str, work: Path,
                context: int) -> tuple[dict[str, str], list[str]]:
    """The environment (added to the user's) and the leading arguments that point agent
    ``name`` at the server at ``url`` serving ``model`` with a ``context``-token window; files it
    needs go in ``work``."""
    if name == "claude":
        env = {"ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": key, "ANTHROPIC_MODEL": model,
               "ANTHROPIC_DEFAULT_HAIKU_MODEL": model, "ANTHROPIC_DEFAULT_SONNET_MODEL": model,
               "ANTHROPIC_DEFAULT_OPUS_MODEL": model, "CLAUDE_CODE_SUBAGENT_MODEL": model,
               "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1",
               "CLAUDE_CODE_ATTRIBUTION_HEADER": "0", "CLAUDE_CODE_AUTO_COMPACT_WINDOW": str(context),
               "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(output_limit(context))}
        return env, []
    if name == "codex":
        home = work / "codex"
        home.mkdir(parents=True, exist_ok=True)
        (home / "config.toml").write_text(
            f'model = {json.dumps(model)}\nmodel_provider = "glmserve"\nmodel_context_window = {context}\n'
            f'model_auto_compact_token_limit = {context * 9 // 10}\n\n[model_providers.glmserve]\n'
            f'name = "glmserve"\nbase_url = {json.dumps(url + "/v1")}\nwire_api = "responses"\n'
            'env_key = "GLMSERVE_API_KEY"\n')
        return {"CODEX_HOME": str(home), "GLMSERVE_API_KEY": key}, []
    config = work / "opencode.json"
    config.write_text(json.dumps({
        "$schema": "https://opencode.ai/config.json", "model": f"glmserve/{model}",
        "provider": {"glmserve": {"npm": "@ai-sdk/openai-compatible", "name": "glmserve",
                                  "options": {"baseURL": url + "/v1", "apiKey": key},
                                  "models": {model: {"name": model, "limit": {
                                      "context": context, "output": output_limit(context)}}}}}}, indent=2))
    return {"OPENCODE_CONFIG": str(config)}, []


def _flag(args: list[str], name: str) -> str | None:
    for i, word in enumerate(args):
        if word == name and i + 1 < len(args):
            return args[i + 1]
        if word.startswith(name + "="):
            return word.split("=", 1)[1]
    return None


def _start(serve: list[str], state_dir: Path) -> tuple[subprocess.Popen, str, Path]:
    """``glmserve serve SERVE`` on a free port, healthy; (process, URL, log file). Raises
    ``LaunchError`` with the log's last line when it stops first."""
    port = free_port()
    if _flag(serve, "--n-ctx") is None and "GLMSERVE_N_CTX" not in os.environ:
        serve = [*serve, "--n-ctx", "0"]  # the model's own context, cut to what fits
    state_dir.mkdir(parents=True, exist_ok=True)
    log_path = state_dir / f"launch-{port}.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "glmserve", "serve", *serve, "--host", "127.0.0.1",
                                 "--port", str(port)], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    print(f"glmserve: starting the server on {url} (its log: {log_path})", file=sys.stderr)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            lines = [line for line in log_path.read_text().splitlines() if line.strip()]
            raise LaunchError(f"the server stopped: {lines[-1] if lines else f'exit status {proc.returncode}'}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url, log_path
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.terminate()
    raise LaunchError(f"the server did not start in {START_TIMEOUT_S:.0f} s (its log: {log_path})")


def _model(url: str, key: str) -> tuple[str, int]:
    """The server's first model and its context in tokens (``max_model_len``; ``AGENT_CONTEXT``
    from a server that does not say)."""
    try:
        models = httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=10)
    except httpx.HTTPError as exc:
        raise LaunchError(f"no server answers at {url}: {exc}") from None
    if models.status_code != 200 or not models.json().get("data"):
        raise LaunchError(f"{url}/v1/models answered {models.status_code}: {models.text[:200]}")
    card = models.json()["data"][0]
    return card["id"], int(card.get("max_model_len") or AGENT_CONTEXT)


def launch(args: list[str]) -> int:
    """``glmserve launch``'s whole run (see the module docstring): the agent's exit status.
    Raises ``LaunchError``."""
    if not args or args[0] not in AGENTS:
        raise LaunchError(f"name an agent: glmserve launch {{{','.join(AGENTS)}}} [SERVE FLAGS] [-- AGENT ARGS]")
    name, (url, serve, agent_args) = args[0], split_args(args[1:])
    agent = AGENTS[name]
    exe = shutil.which(agent.command)
    if exe is None:
        raise LaunchError(f"{agent.command} is not installed: npm install -g {agent.package}")
    key = _flag(serve, "--api-key") or os.environ.get("GLMSERVE_API_KEY", "").split(",")[0] or "glmserve"
    proc = None
    try:
        if url is None:
            from glmserve.settings.serve import ServeSettings

            state_dir = Path(_flag(serve, "--state-dir") or os.environ.get("GLMSERVE_STATE_DIR")
                             or ServeSettings.model_fields["state_dir"].default)
            proc, url, _ = _start(serve, state_dir.expanduser())
        elif serve:
            raise LaunchError("with --url the server runs already: serve flags cannot apply to it")
        model, context = _model(url, key)
        print(f"glmserve: {model} with a context of {context} tokens", file=sys.stderr)
        if context < AGENT_CONTEXT:
            print(f"glmserve: warning: {name}'s own prompt and a session's turns need about {AGENT_CONTEXT} tokens; "
                  "give --n-ctx (the server's log says what its KV cache holds)", file=sys.stderr)
        with tempfile.TemporaryDirectory(prefix=f"glmserve-{name}-") as work:
            env, lead = agent_setup(name, url, model, key, Path(work), context)
            return subprocess.run([exe, *lead, *agent_args], env={**os.environ, **env}).returncode
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
