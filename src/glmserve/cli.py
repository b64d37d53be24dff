"""``glmserve`` command line: ``glmserve serve [flags]``.

Flags are generated from the settings classes (``settings.py``) by pydantic-settings, so each
flag is also a ``GLMSERVE_<NAME>`` environment variable. ``--help`` lists them in the groups of
``flags.flag_groups`` (server, model, engine, limits, scale-out for ``serve``), one line each.
"""

from __future__ import annotations

import argparse
import logging
import logging.config
import signal
import socket
import sys
from pathlib import Path

from glmserve.flags import fail as _fail
from glmserve.flags import given_flags, parse_flags
from glmserve.settings.bench import BenchSettings
from glmserve.settings.serve import ChatSettings, DeploySettings

USAGE = """usage: glmserve COMMAND [flags]

commands:
  serve   start the OpenAI-compatible server (glmserve serve --help for flags)
  chat    chat in the terminal: in-process, or with any server via --url (--help for flags)
  bench   load-test any OpenAI-compatible server: TTFT, TPOT, ITL, throughput (--help for flags)
  pull    fetch a model by name into the Hugging Face cache, without serving it (--help)
  models  list the models here: the Hugging Face cache's and --models-dir's, with their sizes
  launch  run a coding agent against glmserve: glmserve launch claude|codex|opencode
          [SERVE FLAGS | --url URL] [-- AGENT ARGS]
"""


def bench(args: list[str]) -> int:
    settings = parse_flags(BenchSettings, args)
    from glmserve.bench import BenchError, run_bench

    try:
        return run_bench(settings)
    except BenchError as exc:
        return _fail(str(exc))
    except ImportError as exc:
        return _fail(f"{exc.name} is needed for --plot (pip install '.[bench]')")


def chat(args: list[str]) -> int:
    settings = parse_flags(ChatSettings, args)
    unused = settings.unused(given_flags(ChatSettings, args))
    if unused:  # the environment's GLMSERVE_* variables may be a server's: those are left alone
        flags = ", ".join(unused)
        return _fail(f"glmserve chat --url sends requests to a running server and does not use {flags}: set them "
                     "on that server" if settings.url else
                     f"glmserve chat runs the model in this process and does not use {flags} (glmserve serve's)", 2)
    logging.basicConfig(level="WARNING")
    from glmserve.client.terminal import run_chat

    return run_chat(settings)


def pull_parser() -> argparse.ArgumentParser:
    """``glmserve pull``'s flags (``docs/reference/cli.md`` prints its help)."""
    parser = argparse.ArgumentParser(prog="glmserve pull", allow_abbrev=False,
                                     description="Fetch a model by name from the Hugging Face Hub (HF_ENDPOINT, "
                                     "HF_TOKEN) into its cache, as glmserve serve --model would, without serving it.")
    parser.add_argument("model", metavar="ORG/NAME[:QUANT][@REV]",
                        help="a repository; :QUANT picks a GGUF's quantization tag, @REV a branch, tag or commit")
    parser.add_argument("--revision", default=None, metavar="REV", help="a branch, tag or commit (as @REV)")
    parser.add_argument("--engine", choices=["llama_cpp", "transformers", "vllm"], default=None,
                        help="the engine it is for (default: llama_cpp for NAME:QUANT or a name ending in GGUF, "
                             "else transformers)")
    return parser


def pull(args: list[str]) -> int:
    """``glmserve pull ORG/NAME[:QUANT][@REV] [--engine E] [--revision REV]``: what ``serve
    --model`` would fetch."""
    parsed = pull_parser().parse_args(args)
    logging.basicConfig(level="INFO", format="%(message)s")
    from glmserve.models import ModelNotFoundError, hub

    engine = parsed.engine or ("llama_cpp" if ":" in parsed.model or parsed.model.upper().endswith("GGUF")
                               else "transformers")
    try:
        found = hub.fetch(parsed.model, engine, revision=parsed.revision)
    except ModelNotFoundError as exc:
        return _fail(str(exc))
    if found is None:
        return _fail(f"{parsed.model}: not a Hub name (ORG/NAME, ORG/NAME:QUANT, ORG/NAME@REV), or a local path already")
    print(found.path)
    return 0


def models_parser() -> argparse.ArgumentParser:
    """``glmserve models``'s flags (``docs/reference/cli.md`` prints its help)."""
    parser = argparse.ArgumentParser(prog="glmserve models", allow_abbrev=False,
                                     description="List the models here: those in the Hugging Face cache (servable "
                                     "by name) and under each --models-dir, with sizes.")
    parser.add_argument("--models-dir", action="append", default=[], metavar="DIR", help="a folder of models")
    return parser


def models(args: list[str]) -> int:
    """``glmserve models [--models-dir DIR]...``: what ``serve --model`` finds here without a download."""
    parsed = models_parser().parse_args(args)
    from glmserve.models import hub
    from glmserve.runtime.catalog import ConfigError, scan_models_dir

    rows = [(name, kind, size, "Hugging Face cache") for name, kind, size in hub.cached_models()]
    for folder in parsed.models_dir:
        try:
            entries = scan_models_dir(Path(folder).expanduser())
        except ConfigError as exc:
            return _fail(str(exc))
        for entry in entries:
            path = Path(entry.fields["model"])
            files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
            rows.append((entry.name, "gguf" if path.is_file() else "folder", sum(p.stat().st_size for p in files),
                         folder))
    if not rows:
        print("no models here: glmserve pull ORG/NAME fetches one (the embedded default needs none)")
        return 0
    width = max(len(name) for name, *_ in rows)
    for name, kind, size, where in rows:
        print(f"{name:<{width}}  {kind:<6}  {size / 2**20:>10.1f} MiB  {where}")
    return 0


def serve(args: list[str]) -> int:
    from glmserve.runtime.catalog import ConfigError, with_server_settings

    settings = parse_flags(DeploySettings, args)
    try:
        settings = with_server_settings(settings)
    except ConfigError as exc:
        return _fail(f"cannot start: {exc}")
    if settings.on_ray:
        try:
            from glmserve.deploy.ray import DeployError, serve_on_ray
        except ImportError as exc:
            return _fail(f"{exc.name} is needed for Ray Serve replicas (pip install '.[ray]' in the glmserve "
                         "checkout)")
        logging.basicConfig(level=settings.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
        try:
            serve_on_ray(settings)
        except DeployError as exc:
            return _fail(str(exc))
        return 0

    import uvicorn
    from uvicorn.main import STARTUP_FAILURE

    from glmserve.composition import build_app
    from glmserve.runtime.start import STARTUP_ERRORS
    from glmserve.server.http_protocol import guarded_protocol
    from glmserve.server.logs import log_config

    logging.config.dictConfig(log_config(settings.log_level))
    # --fd: the socket glmserve launch bound before starting this process (no one else can take its port)
    try:
        sockets = None if settings.fd is None else [socket.socket(fileno=settings.fd)]
    except OSError as exc:
        return _fail(f"--fd {settings.fd} is not a socket this process holds: {exc.strerror}")
    try:
        app = build_app(settings)
    except STARTUP_ERRORS as exc:
        return _fail(f"cannot start: {exc}")
    loaded = app.state.model_router.loaded_models()[app.state.model_router.default]
    info = loaded.engine.model_info
    host, port = sockets[0].getsockname()[:2] if sockets else (settings.host, settings.port)
    logging.getLogger("glmserve").info(
        "serving %s (n_ctx=%d, max_num_seqs=%d, max_num_batched_tokens=%s, max_queue=%d) on http://%s:%d",
        loaded.pipeline.name, info.context_length, info.max_num_seqs, info.max_num_batched_tokens,
        info.max_queue, host, port,
    )
    # uvicorn shuts down gracefully on SIGTERM/SIGINT, then re-raises the signal into the handler
    # that was installed before it: this one, so that a graceful stop exits with status 0.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    server = uvicorn.Server(uvicorn.Config(
        app, host=settings.host, port=settings.port, log_config=log_config(settings.log_level),
        timeout_graceful_shutdown=settings.shutdown_timeout + 1, http=guarded_protocol(settings.client_header_timeout),
        timeout_keep_alive=settings.timeout_keep_alive))
    server.run(sockets=sockets)
    return 0 if server.started else STARTUP_FAILURE


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in {"-h", "--help", "help"}:
        print(USAGE, end="")
        return 0
    command, rest = argv[0], argv[1:]
    if command == "serve":
        return serve(rest)
    if command == "bench":
        return bench(rest)
    if command == "chat":
        return chat(rest)
    if command == "pull":
        return pull(rest)
    if command == "models":
        return models(rest)
    if command == "launch":
        from glmserve.launch import LaunchError, launch

        try:
            return launch(rest)
        except LaunchError as exc:
            return _fail(str(exc))
    return _fail(f"unknown command {command!r}\n{USAGE}", 2)
