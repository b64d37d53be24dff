"""``glmserve launch claude|codex|opencode [SERVE FLAGS | --url URL [--api-key KEY]] [-- AGENT
ARGS]``: a coding agent run against glmserve, set up as each agent needs (after Ollama's
``ollama launch``), so that it reaches glmserve only, whatever the user's and the project's
agent configuration says.

The server: ``--url URL`` reuses a running one (its key: ``--api-key``, else the first of
``GLMSERVE_API_KEY``); otherwise one is started with the ``serve`` flags given (``glmserve serve
... --fd N``: a port of 127.0.0.1 the launcher binds first, so that no other local user can
take it while the model loads; in its own process group; its log, private to the user, in
``launch-PORT.log`` under ``--state-dir``, where only the newest ``KEPT_LOGS`` are kept),
serving the model's own context (``--n-ctx 0``: its training context, cut to what fits) unless
``--n-ctx`` or ``GLMSERVE_N_CTX`` set one (a ``--config`` entry's own ``n_ctx`` holds for its
model). A ``--model`` by name is fetched by the launcher first, with progress in the terminal
and no time limit. The server requires a key: the first ``--api-key`` (split as the server splits
it), else the first of ``GLMSERVE_API_KEY``, else a random one made for this launch (the keys go
to the server in its environment, never on a command line). The context the server advertises
(``max_model_len``) is printed, with a warning below ``AGENT_CONTEXT``, and given to the agent.
The agent, found on the ``PATH`` (else an error names its npm package), is pointed at the
server's first model:

- ``claude`` (Claude Code, Anthropic's Messages API): its settings on the command line
  (``--settings FILE``, which outranks the user's, the project's and the local settings files):
  ``ANTHROPIC_BASE_URL``, the key in ``ANTHROPIC_API_KEY``, ``ANTHROPIC_AUTH_TOKEN`` and the
  cloud switches (Bedrock, Vertex, Foundry) blanked, the model for every role
  (``ANTHROPIC_MODEL``, the Haiku/Sonnet/Opus defaults, sub-agents), non-essential traffic off,
  and its attribution header off (``CLAUDE_CODE_ATTRIBUTION_HEADER=0``: it changes the system
  prompt on every request, so no prefix cache would ever match); the context as its
  auto-compact window (``CLAUDE_CODE_AUTO_COMPACT_WINDOW``) and a reply's ceiling
  (``CLAUDE_CODE_MAX_OUTPUT_TOKENS``), each kept where the user's environment sets it, and a
  prompt over it answered with the 400 it compacts on (``prompt is too long``);
- ``codex`` (Codex CLI, the Responses API): the user's own ``CODEX_HOME`` (sessions, MCP
  servers, AGENTS.md kept), with ``-c`` overrides, which outrank its ``config.toml`` (a
  ``--profile`` among the agent's arguments is the user's word, and outranks them): a
  ``glmserve`` provider with ``wire_api = "responses"`` and the key in ``GLMSERVE_API_KEY``, its
  model, the context as ``model_context_window`` and compaction at 9/10 of it
  (``model_auto_compact_token_limit``);
- ``opencode`` (OpenCode, chat completions): ``OPENCODE_CONFIG_CONTENT``, the configuration
  OpenCode ranks above a project's ``opencode.json`` and its global one: an
  ``@ai-sdk/openai-compatible`` provider, the only one enabled, its model for ``model`` and
  ``small_model``, ``limit.context`` and ``limit.output``.

A reply's ceiling is ``output_limit``: a quarter of the context, at most 32768 tokens.

Signals: Ctrl-C is the agent's (the launcher waits for it); SIGTERM and SIGHUP are passed to it.
When the agent ends, the server is stopped (SIGTERM, SIGKILL after ``STOP_TIMEOUT_S``); a signal
before the agent starts stops it at once; on Linux it gets a SIGTERM when the launcher dies of
anything. Exit status: ``USAGE``'s."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx


AGENT_CONTEXT = 32768  # tokens a coding agent's session needs (its own prompt: 9k-20k)
START_TIMEOUT_S = 1800.0  # a model (already fetched) that is not serving in this long is a failed start
STOP_TIMEOUT_S = 60.0
KEPT_LOGS = 10
# Claude Code's variables that would send its requests elsewhere or with another key: blanked
CLAUDE_BLANKED = ("ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_USE_BEDROCK", "CLAUDE_CODE_USE_VERTEX",
                  "CLAUDE_CODE_USE_FOUNDRY")
# Claude Code's limits the launch sets, unless the user's environment sets them for the run
CLAUDE_TUNABLE = ("CLAUDE_CODE_MAX_OUTPUT_TOKENS", "CLAUDE_CODE_AUTO_COMPACT_WINDOW", "CLAUDE_CODE_ATTRIBUTION_HEADER")


@dataclass(frozen=True)
class Agent:
    command: str
    package: str  # its npm package


AGENTS = {"claude": Agent("claude", "@anthropic-ai/claude-code"), "codex": Agent("codex", "@openai/codex"),
          "opencode": Agent("opencode", "opencode-ai")}


# ``glmserve launch --help`` (``docs/reference/cli.md`` prints it)
USAGE = f"""usage: glmserve launch {{{','.join(AGENTS)}}} [SERVE FLAGS | --url URL [--api-key KEY]] [-- AGENT ARGS]

Run a coding agent against glmserve, set up so that it reaches glmserve only, whatever the
user's and the project's agent configuration say.

  SERVE FLAGS      start a server on 127.0.0.1 with glmserve serve's flags (glmserve serve --help)
                   for the agent's run, serving the model's own context unless --n-ctx is given
  --url URL        use a running server instead (no serve flags but --api-key)
  --api-key KEY    the key the agent sends, and a started server requires (default: the first
                   of GLMSERVE_API_KEY, else a random one, which a --url server without keys ignores)
  -- AGENT ARGS    the agent's own arguments, e.g. -- -p "a prompt" (claude), -- exec "a task" (codex)

Exit status: the agent's; 128 + N when signal N ended the launch before the agent ran; 2 for
a bad serve flag; 1 with a one-line error.
"""


class LaunchError(Exception):
    """Why the agent cannot be launched, in one line."""


class Stopped(Exception):
    """A signal (``signum``) ended the launch before the agent ran."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def split_args(args: list[str]) -> tuple[str | None, list[str], list[str]]:
    """``(--url, serve flags, agent args)`` of the words after the agent's name. Raises
    ``LaunchError`` for ``--url`` with serve flags other than ``--api-key``."""
    serve, agent = (args[:args.index("--")], args[args.index("--") + 1:]) if "--" in args else (args, [])
    url = None
    if "--url" in serve:
        at = serve.index("--url")
        if at + 1 >= len(serve):
            raise LaunchError("--url needs a URL")
        url, serve = serve[at + 1].rstrip("/"), serve[:at] + serve[at + 2:]
        if _without(serve, "--api-key"):
            raise LaunchError("with --url the server runs already: serve flags (but --api-key) cannot apply to it")
    if any(_flags(serve, name) for name in ("--host", "--port", "--fd")):
        raise LaunchError("a launched server listens on a port of 127.0.0.1 that the launch binds: --host, --port "
                          "and --fd cannot apply to it (--url uses a server of your own)")
    return url, serve, agent


def output_limit(context: int) -> int:
    """A reply's ceiling in tokens for a ``context``-token window: a quarter of it, at most 32768."""
    return min(context // 4, 32768)


def agent_setup(name: str, url: str, model: str, key: str, work: Path, context: int,
                environ: Mapping[str, str] = os.environ) -> tuple[dict[str, str | None], list[str]]:
    """The environment changes (None: the variable removed) and the leading arguments that point
    agent ``name`` at the server at ``url`` serving ``model`` with a ``context``-token window,
    over whatever the user's and the project's configuration of that agent say; files it needs
    go in ``work`` (private to the user). Claude Code's limits (``CLAUDE_TUNABLE``) set in
    ``environ`` (the user's environment: their word for this run) are kept."""
    if name == "claude":
        env = {"ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": key, "ANTHROPIC_MODEL": model,
               "ANTHROPIC_DEFAULT_HAIKU_MODEL": model, "ANTHROPIC_DEFAULT_SONNET_MODEL": model,
               "ANTHROPIC_DEFAULT_OPUS_MODEL": model, "CLAUDE_CODE_SUBAGENT_MODEL": model,
               "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1",
               "CLAUDE_CODE_ATTRIBUTION_HEADER": "0", "CLAUDE_CODE_AUTO_COMPACT_WINDOW": str(context),
               "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(output_limit(context))}
        env.update({k: environ[k] for k in CLAUDE_TUNABLE if environ.get(k)})
        settings = work / "claude-settings.json"
        settings.write_text(json.dumps({"env": {**env, **dict.fromkeys(CLAUDE_BLANKED, "")}}, indent=2))
        return {**env, **dict.fromkeys(CLAUDE_BLANKED)}, ["--settings", str(settings)]
    if name == "codex":
        provider = (f'{{name = "glmserve", base_url = {json.dumps(url + "/v1")}, wire_api = "responses", '
                    'env_key = "GLMSERVE_API_KEY"}')
        overrides = [f"model_providers.glmserve={provider}", 'model_provider="glmserve"', f"model={json.dumps(model)}",
                     f"model_context_window={context}", f"model_auto_compact_token_limit={context * 9 // 10}"]
        return {"GLMSERVE_API_KEY": key}, [word for override in overrides for word in ("-c", override)]
    ours = f"glmserve/{model}"
    config = {"$schema": "https://opencode.ai/config.json", "model": ours, "small_model": ours,
              "enabled_providers": ["glmserve"], "disabled_providers": [],
              "provider": {"glmserve": {"npm": "@ai-sdk/openai-compatible", "name": "glmserve",
                                        "options": {"baseURL": url + "/v1", "apiKey": "{env:GLMSERVE_API_KEY}"},
                                        "models": {model: {"name": model, "limit": {
                                            "context": context, "output": output_limit(context)}}}}}}
    return {"OPENCODE_CONFIG_CONTENT": json.dumps(config), "GLMSERVE_API_KEY": key}, []


def _flags(args: list[str], name: str) -> list[str]:
    """Every value of flag ``name`` in ``args`` (``--name V`` or ``--name=V``)."""
    values = []
    for i, word in enumerate(args):
        if word == name and i + 1 < len(args):
            values.append(args[i + 1])
        elif word.startswith(name + "="):
            values.append(word.split("=", 1)[1])
    return values


def _without(args: list[str], name: str) -> list[str]:
    """``args`` without flag ``name`` and its values."""
    left, skip = [], False
    for word in args:
        if skip or word.startswith(name + "="):
            skip = False
        elif word == name:
            skip = True
        else:
            left.append(word)
    return left


def server_key(serve: list[str]) -> tuple[str, dict[str, str], list[str]]:
    """The key the agent sends, what the server's environment needs for it, and the serve flags
    without ``--api-key``: the first key of ``--api-key`` (repeated, or ``a,b``, or a JSON list,
    as the server reads it; all of them go to the server as ``GLMSERVE_API_KEY``, never on its
    command line, which every user of the machine can read), else the first of
    ``GLMSERVE_API_KEY``, else a random key, given to the server as ``GLMSERVE_API_KEY``."""
    from glmserve.settings.server import ListenSettings

    flagged = [key for value in _flags(serve, "--api-key") for key in ListenSettings(api_key=value).api_key]
    serve = _without(serve, "--api-key")
    if flagged:
        return flagged[0], {"GLMSERVE_API_KEY": json.dumps(flagged)}, serve
    if os.environ.get("GLMSERVE_API_KEY"):
        return ListenSettings(api_key=os.environ["GLMSERVE_API_KEY"]).api_key[0], {}, serve
    key = secrets.token_urlsafe(24)
    return key, {"GLMSERVE_API_KEY": key}, serve


def _prefetch(settings) -> None:
    """A ``--model`` by name (of the serve flags' ``settings``) fetched into the Hugging Face
    cache before the server starts, with huggingface_hub's progress bars in the terminal (a line
    every few seconds elsewhere) and no time limit; the server then finds it there. Raises
    ``LaunchError``."""
    from glmserve.models import ModelNotFoundError, hub

    if hub.hub_name(settings.model) is None:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("glmserve: %(message)s"))
    logger = logging.getLogger("glmserve.hub")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        hub.fetch(settings.model, settings.engine, settings.offline, settings.revision)
    except ModelNotFoundError as exc:
        raise LaunchError(str(exc)) from None
    finally:
        logger.removeHandler(handler)


def _prune_logs(state_dir: Path) -> None:
    """The launch logs under ``state_dir`` but the newest ``KEPT_LOGS - 1`` removed (room for
    the one about to be written)."""
    logs = sorted(state_dir.glob("launch-*.log"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in logs[KEPT_LOGS - 1:]:
        old.unlink(missing_ok=True)


def _start(serve: list[str], state_dir: Path, env: dict[str, str]) -> tuple[subprocess.Popen, str, Path]:
    """``glmserve serve SERVE`` on a free port of 127.0.0.1 (bound first), in its own process group (a Ctrl-C in the
    terminal does not reach it), with ``env`` added to its environment, healthy; (process, URL,
    log file). Raises ``LaunchError`` with the log's last line when it stops first."""
    if not _flags(serve, "--n-ctx") and "GLMSERVE_N_CTX" not in os.environ:
        serve = [*serve, "--n-ctx", "0"]  # the model's own context, cut to what fits
    state_dir.mkdir(parents=True, exist_ok=True)
    _prune_logs(state_dir)
    # the port is bound before the server starts (--fd): while the model loads, no other local user
    # can take it and answer in the server's place (to be sent the key and the repository)
    with socket.create_server(("127.0.0.1", 0), backlog=128) as listener:
        port = listener.getsockname()[1]
        log_path = state_dir / f"launch-{port}.log"
        with open(os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as log:
            os.fchmod(log.fileno(), 0o600)  # the log of an earlier launch on this port
            proc = subprocess.Popen([sys.executable, "-m", "glmserve", "serve", *serve, "--fd", str(listener.fileno())],
                                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env={**os.environ, **env}, start_new_session=True, preexec_fn=_die_with_parent,
                                    pass_fds=(listener.fileno(),))
    url = f"http://127.0.0.1:{port}"
    print(f"glmserve: starting the server on {url} (its log: {log_path})", file=sys.stderr)
    try:
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
        raise LaunchError(f"the server did not start in {START_TIMEOUT_S:.0f} s (its log: {log_path})")
    except BaseException:
        _stop(proc)
        raise


def _sweep_work_dirs() -> None:
    """The agents' work folders (``glmserve-AGENT-PID-*``, private, holding Claude Code's settings
    with the key) of launches killed outright (PID gone) removed; a launch removes its own."""
    for folder in (f for agent in AGENTS for f in Path(tempfile.gettempdir()).glob(f"glmserve-{agent}-*-*")):
        with contextlib.suppress(OSError):  # a PID alive under another user, a folder gone meanwhile
            pid = folder.name.split("-")[2]
            try:
                if folder.is_dir() and folder.stat().st_uid == os.getuid() and pid.isdigit():
                    os.kill(int(pid), 0)
            except ProcessLookupError:
                shutil.rmtree(folder, ignore_errors=True)


def _die_with_parent() -> None:
    """In the server's process (Linux): SIGTERM to it when the launcher dies, even of a SIGKILL,
    so that no server outlives its launch (``prctl(PR_SET_PDEATHSIG)``)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _stop(proc: subprocess.Popen) -> None:
    """The server ended: SIGTERM (its graceful shutdown), SIGKILL to its process group after
    ``STOP_TIMEOUT_S``."""
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


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


class _Signals:
    """SIGTERM and SIGHUP (and SIGINT before the agent runs) raise ``Stopped``; while the agent
    runs, SIGTERM and SIGHUP are passed to it and SIGINT is left to it (the terminal sends it to
    the agent too)."""

    HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self.agent: subprocess.Popen | None = None
        self.before = {signum: signal.signal(signum, self._handle) for signum in self.HANDLED}

    def _handle(self, signum: int, frame) -> None:
        if self.agent is None:
            raise Stopped(signum)
        if signum != signal.SIGINT and self.agent.poll() is None:
            self.agent.send_signal(signum)

    def restore(self) -> None:
        for signum, handler in self.before.items():
            signal.signal(signum, handler)


def launch(args: list[str]) -> int:
    """``glmserve launch``'s whole run (see the module docstring): the agent's exit status.
    Raises ``LaunchError``."""
    if args and args[0] in ("-h", "--help"):
        print(USAGE, end="")
        return 0
    if not args or args[0] not in AGENTS:
        raise LaunchError(f"name an agent: glmserve launch {{{','.join(AGENTS)}}} [SERVE FLAGS] [-- AGENT ARGS]")
    name, (url, serve, agent_args) = args[0], split_args(args[1:])
    agent = AGENTS[name]
    exe = shutil.which(agent.command)
    if exe is None:
        raise LaunchError(f"{agent.command} is not installed: npm install -g {agent.package}")
    key, server_env, serve = server_key(serve)
    _sweep_work_dirs()
    signals, proc = _Signals(), None
    try:
        if url is None:
            from glmserve.flags import parse_flags
            from glmserve.settings.serve import DeploySettings

            settings = parse_flags(DeploySettings, serve)  # a bad flag: its one line, exit status 2
            _prefetch(settings)
            proc, url, _ = _start(serve, Path(settings.state_dir).expanduser(), server_env)
        model, context = _model(url, key)
        print(f"glmserve: {model} with a context of {context} tokens", file=sys.stderr)
        if context < AGENT_CONTEXT:
            print(f"glmserve: warning: {name}'s own prompt and a session's turns need about {AGENT_CONTEXT} tokens; "
                  "give --n-ctx (the server's log says what its KV cache holds)", file=sys.stderr)
        with tempfile.TemporaryDirectory(prefix=f"glmserve-{name}-{os.getpid()}-") as work:
            changes, lead = agent_setup(name, url, model, key, Path(work), context)
            env = {k: v for k, v in {**os.environ, **changes}.items() if v is not None}
            signals.agent = subprocess.Popen([exe, *lead, *agent_args], env=env)
            return signals.agent.wait()
    except Stopped as stop:
        return 128 + stop.signum
    finally:
        if signals.agent is not None and signals.agent.poll() is None:  # an error while it ran
            signals.agent.terminate()
            signals.agent.wait()
        signals.restore()
        if proc is not None:
            _stop(proc)
