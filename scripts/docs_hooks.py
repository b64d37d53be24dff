"""The reference pages' generated parts, kept in the pages themselves (so that they read on the
code host too) between ``<!-- glmserve:NAME [ARG] -->`` and ``<!-- /glmserve:NAME -->``:
``python scripts/docs_hooks.py`` writes them anew (``--check``: exits 1, naming the pages, when
one is not what the code renders; ``tests/e2e/test_docs.py`` runs it), and as a MkDocs hook
(``mkdocs.yml``, ``hooks:``) it renders them again at build time, so the site cannot drift from
the code.

- ``<!-- glmserve:flags serve|chat|bench -->``: that command's flags, group by group, rendered from
  ``glmserve.flags.flag_groups`` as ``glmserve COMMAND --help`` prints them (one line of help each,
  ending in the default), with each flag's environment variable;
- ``<!-- glmserve:usage pull|models|launch -->``: that command's ``--help``, as it prints it, in a
  ``text`` block;
- ``<!-- glmserve:routes -->``: every route in the OpenAPI document of a server on the default
  model (started with ``--allow-runtime-lora-updating`` and a ``--models-dir`` of one more model,
  so that the LoRA and model-admin routes are in it), with the statuses it declares;
- ``<!-- glmserve:metrics -->``: the metric families of that server's ``/metrics`` (started with
  ``--speculative ngram``, so that the speculative-decoding counters are in it).

The server is built in-process once per build (``composition.build_app``, about a second on the
default model) and shut down through its lifespan.
"""

from __future__ import annotations

import functools
import re
import tempfile
from pathlib import Path

BLOCK = re.compile(r"<!-- glmserve:(\w+)(?: (\w+))? -->\n.*?<!-- /glmserve:\1 -->", re.S)
PAGES = ("flags.md", "cli.md", "routes.md", "metrics.md")  # under docs/reference

# each route's page in these docs, by path prefix (first match wins)
ROUTE_PAGES = (
    ("/v1/messages/batches", "../guides/state.md#batches"),
    ("/v1/messages", "anthropic-api.md"),
    ("/v1/files", "../guides/state.md#batches"),
    ("/v1/batches", "../guides/state.md#batches"),
    ("/v1/load_lora_adapter", "../guides/lora.md#at-run-time"),
    ("/v1/unload_lora_adapter", "../guides/lora.md#at-run-time"),
    ("/models/", "../guides/many-models.md"),
    ("/metrics", "metrics.md"),
    ("/v1/responses/", "../guides/state.md"),
    ("/v1/conversations", "../guides/state.md#conversations"),
    ("/health", "../getting-started.md#what-the-server-says-about-itself"),
    ("/v1/models", "../getting-started.md#what-the-server-says-about-itself"),
    ("/", "openai-api.md"),
)


def _cell(text: str) -> str:
    """``text`` as a Markdown table cell: Markdown's own characters escaped, so the cell reads
    exactly as ``--help`` prints it."""
    return re.sub(r"([\\`*_\[\]<>|{}#])", r"\\\1", text)


def settings_class(command: str):
    from glmserve.settings.bench import BenchSettings
    from glmserve.settings.serve import ChatSettings, DeploySettings

    return {"serve": DeploySettings, "chat": ChatSettings, "bench": BenchSettings}[command]


def render_flags(command: str) -> str:
    """The flags of ``glmserve COMMAND`` as Markdown: for ``serve`` a section per group; for
    ``chat``, only its own group (the rest are ``serve``'s); for ``bench`` its one group."""
    from glmserve.flags import flag_groups

    groups = flag_groups(settings_class(command))
    if command != "serve":
        groups = groups[:1]
    out = []
    for group in groups:
        if command == "serve":
            out += [f"## {group.title}", "", group.description, ""]
        out += ["| flag | help | environment variable |", "|---|---|---|"]
        for flag in group.flags:
            usage = f"{flag.flag}, --no-{flag.flag[2:]}" if flag.metavar is None else f"{flag.flag} {flag.metavar}"
            out.append(f"| `{usage}` | {_cell(flag.help)} | `{flag.env}` |")
        out.append("")
    return "\n".join(out)


def render_usage(command: str) -> str:
    """``glmserve COMMAND --help`` for ``pull``, ``models`` and ``launch``, in a fenced block."""
    import os

    from glmserve import cli, launch

    if command == "launch":
        text = launch.USAGE
    else:
        columns = os.environ.get("COLUMNS")
        os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal: the page's width, whatever runs it
        try:
            text = {"pull": cli.pull_parser, "models": cli.models_parser}[command]().format_help()
        finally:
            if columns is None:
                del os.environ["COLUMNS"]
            else:
                os.environ["COLUMNS"] = columns
    return f"```text\n{text.rstrip()}\n```\n"


@functools.cache
def _live_server() -> tuple[dict, str]:
    """(the OpenAPI document, the /metrics text) of a server on the default model."""
    from fastapi.testclient import TestClient

    from glmserve.composition import build_app
    from glmserve.settings.serve import DeploySettings

    from glmserve.models.resolve import default_model_path

    with tempfile.TemporaryDirectory() as models_dir:
        # a second model, never loaded, so that the routes of a server of several are in the document
        (Path(models_dir) / "second.gguf").symlink_to(default_model_path())
        settings = DeploySettings(allow_runtime_lora_updating=True, speculative="ngram", n_ctx=512, max_num_seqs=1,
                                  models_dir=[models_dir])
        with TestClient(build_app(settings)) as client:
            return client.get("/openapi.json").json(), client.get("/metrics").text


def render_routes(_: str | None = None) -> str:
    document, _ = _live_server()
    out = ["| method | path | what | statuses | page |", "|---|---|---|---|---|"]
    for path, operations in document["paths"].items():
        page = next(target for prefix, target in ROUTE_PAGES if path.startswith(prefix))
        for method, operation in operations.items():
            statuses = ", ".join(sorted(operation.get("responses", {})))
            out.append(f"| {method.upper()} | `{path}` | {_cell(operation.get('summary', ''))} | {statuses} | "
                       f"[{page.split('#')[0].split('/')[-1].removesuffix('.md')}]({page}) |")
    return "\n".join(out) + "\n"


def render_metrics(_: str | None = None) -> str:
    _, text = _live_server()
    kinds = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    out = ["| name | type | what |", "|---|---|---|"]
    for name, what in re.findall(r"^# HELP (\S+) (.*)$", text, re.M):
        exposed = f"{name}_total" if kinds.get(name) == "counter" and not name.endswith("_total") else name
        out.append(f"| `{exposed}` | {kinds.get(name, '')} | {_cell(what)} |")
    return "\n".join(out) + "\n"


RENDER = {"flags": render_flags, "usage": render_usage, "routes": render_routes, "metrics": render_metrics}


def fill(markdown: str, marks: bool = True) -> str:
    """``markdown`` with each generated block rendered anew from the code (``marks``: between
    its marks, as the pages keep it; else alone, as the site shows it)."""
    def block(m: re.Match) -> str:
        name, arg = m.group(1), m.group(2)
        table = RENDER[name](arg).strip()
        if not marks:
            return table
        return f"<!-- glmserve:{name}{' ' + arg if arg else ''} -->\n\n{table}\n\n<!-- /glmserve:{name} -->"

    return BLOCK.sub(block, markdown)


def on_page_markdown(markdown: str, page, config, files, **kwargs) -> str:
    """MkDocs event: each generated block rendered anew."""
    return fill(markdown, marks=False)


def main(argv: list[str]) -> int:
    stale = []
    for name in PAGES:
        page = Path(__file__).parent.parent / "docs" / "reference" / name
        text = page.read_text()
        if fill(text) != text:
            stale.append(str(page))
            if "--check" not in argv:
                page.write_text(fill(text))
    if stale and "--check" in argv:
        print("not what the code renders (run python scripts/docs_hooks.py):", *stale, sep="\n  ")
        return 1
    return 0


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(Path(__file__).parent.parent))  # scripts/ as a package, as the tests import it
    sys.exit(main(sys.argv[1:]))
