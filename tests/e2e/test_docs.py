"""The documentation site: ``mkdocs build --strict`` succeeds (a broken link, anchor or a page
missing from the nav fails it); the generated flag reference says exactly what ``glmserve serve
--help`` (and ``chat``, ``bench``) print; the route and metric tables hold the server's routes and
metrics; every ``glmserve serve|chat|bench`` command and config file in the docs is read as
glmserve reads it; the README is short and its links resolve."""

from __future__ import annotations

import argparse
import html
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from glmserve.cli import models_parser, pull_parser
from glmserve.flags import parse_flags
from glmserve.launch import AGENTS, LaunchError, agent_setup, split_args
from glmserve.engine import check_engine_settings
from glmserve.runtime.catalog import read_config
from glmserve.runtime.start import model_settings
from glmserve.settings.serve import DeploySettings, ServeSettings
from scripts.docs_hooks import settings_class
from tests.benchmark_scripts import load
from tests.docs_examples import ROOT, benchmark_commands, cli_commands, examples, pages, yaml_blocks


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built with ``--strict`` as ``make docs`` builds it."""
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def _text(fragment: str) -> str:
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", "", fragment))).strip()


def _rows(page: Path) -> list[list[str]]:
    """The cells of every table row of a built page, header rows left out."""
    return [[_text(cell) for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
            for row in re.findall(r"<tr>(.*?)</tr>", page.read_text(), re.S) if "<td" in row]


def _help(command: str) -> tuple[list[str], list[tuple[str, str]]]:
    """``glmserve COMMAND --help`` as (its group titles, [(flag usage, help)]), -h left out."""
    proc = subprocess.run([sys.executable, "-m", "glmserve", command, "--help"], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "COLUMNS": "100"})
    assert proc.returncode == 0, proc.stderr
    titles = re.findall(r"^([a-z-]+):$", proc.stdout, re.M)
    flags: list[tuple[str, str]] = []
    lines = proc.stdout.splitlines()
    for i, line in enumerate(lines):
        if not line.startswith("  --"):
            continue
        usage, _, text = line.strip().partition("  ")
        flags.append((usage, text.strip() or lines[i + 1].strip()))
    return titles, flags


def test_the_site_builds_strictly_with_every_section(site):
    for page in ("index.html", "getting-started/index.html", "guides/coding-agents/index.html",
                 "guides/gpu-vllm/index.html", "guides/many-models/index.html", "guides/lora/index.html",
                 "guides/vision/index.html", "guides/tools/index.html", "guides/ray/index.html",
                 "guides/chat-ui/index.html", "guides/python-api/index.html", "reference/flags/index.html",
                 "reference/cli/index.html",
                 "reference/routes/index.html", "reference/metrics/index.html", "performance/index.html",
                 "design/index.html"):
        assert (site / page).is_file(), page
    # no generation mark is left unfilled
    for page in site.rglob("*.html"):
        assert "<!-- glmserve:" not in page.read_text(), page


def test_every_page_explains_the_terms_on_hover_and_the_glossary_has_them(site):
    """``docs_includes/abbreviations.md`` is appended to every page (pymdownx.snippets): a term
    shows its meaning where a page uses it, before or without the glossary; each is a glossary
    term too."""
    terms = dict(re.findall(r"^\*\[([^\]]+)\]: (.+)$", (ROOT / "docs_includes" / "abbreviations.md").read_text(), re.M))
    assert {"GGUF", "TTFT", "TPOT", "p50", "MTP"} <= terms.keys()
    glossary = (ROOT / "docs" / "reference" / "glossary.md").read_text()
    assert all(re.search(rf"^\*\*.*\b{re.escape(term)}\b.*\*\*$", glossary, re.M) for term in terms), terms
    performance = (site / "performance" / "index.html").read_text()
    assert f'<abbr title="{html.escape(terms["TPOT"])}">TPOT</abbr>' in performance


def test_the_flag_reference_is_what_help_prints(site):
    rows = _rows(site / "reference" / "flags" / "index.html")
    documented = [(usage, text) for usage, text, _ in rows]
    titles, serve = _help("serve")
    _, chat = _help("chat")
    _, bench = _help("bench")
    chat_own = [flag for flag in chat if flag[0].split()[0] in {"--url", "--system", "--temperature", "--top-p",
                                                                "--max-tokens"}]
    assert documented == serve + chat_own + bench
    assert len(serve) == len(DeploySettings.model_fields)
    # the page's sections are --help's groups, in order
    headings = [_text(h) for h in re.findall(r"<h2[^>]*>(.*?)</h2>", (site / "reference/flags/index.html").read_text())]
    groups = [t for t in titles if t != "options"]
    assert [h.rstrip("¶").strip() for h in headings][:len(groups)] == groups
    # and each flag's environment variable
    assert ["--port N", "TCP port to listen on. (default: 8000)", "GLMSERVE_PORT"] in rows


def test_the_route_table_holds_every_route_group(site):
    rows = {(method, path) for method, path, *_ in _rows(site / "reference" / "routes" / "index.html")}
    for route in (("POST", "/v1/chat/completions"), ("POST", "/v1/completions"), ("POST", "/v1/responses"),
                  ("POST", "/v1/messages"), ("POST", "/v1/messages/count_tokens"), ("POST", "/v1/embeddings"),
                  ("GET", "/v1/models"), ("GET", "/health"), ("GET", "/metrics"), ("POST", "/tokenize"),
                  ("POST", "/v1/load_lora_adapter"), ("POST", "/models/unload"), ("GET", "/models/events")):
        assert route in rows, route


def test_the_metric_table_holds_the_served_metrics(site):
    names = {name for name, *_ in _rows(site / "reference" / "metrics" / "index.html")}
    for name in ("glmserve:time_to_first_token_seconds", "glmserve:request_success_total",
                 "glmserve:num_requests_running", "glmserve:kv_cache_usage_perc",
                 "glmserve:prompt_cache_ram_bytes", "glmserve:spec_decode_num_drafts_total"):
        assert name in names, name


@pytest.mark.parametrize("where,command,flags", cli_commands(), ids=[f"{w}:{c}" for w, c, _ in cli_commands()])
def test_every_glmserve_command_in_the_docs_parses(where, command, flags, capsys):
    url = None
    if command == "launch":  # an agent, then serve's flags (or --url and --api-key), then the agent's own
        assert flags[0] in AGENTS, f"{where}: glmserve launch {flags[0]}"
        try:
            url, flags, _ = split_args(flags[1:])
        except LaunchError as exc:
            pytest.fail(f"{where}: glmserve launch: {exc}")
        command = "serve"
    try:
        if command in ("pull", "models"):
            {"pull": pull_parser, "models": models_parser}[command]().parse_args(flags)
            return
        if url is not None:  # a running server: only the key it is sent (split_args checks)
            return
        settings = parse_flags(settings_class(command), flags)
    except SystemExit:
        pytest.fail(f"{where}: glmserve {command} {' '.join(flags)}: {capsys.readouterr().err}")
    if command != "bench":  # and every flag is one the chosen engine reads, as start-up checks
        check_engine_settings(settings)


class _Parsed(Exception):
    """A benchmark's arguments parsed: its run stops here."""


@pytest.mark.parametrize("where,script,words", benchmark_commands(),
                         ids=[f"{w}:{s}" for w, s, _ in benchmark_commands()])
def test_every_benchmark_command_in_the_docs_parses(where, script, words, monkeypatch, capsys):
    """Each ``python benchmarks/NAME.py ...`` of the docs is parsed by the script's own parser
    (its ``main`` run with those words until ``parse_args`` returns): an odd ``--rounds``, a
    renamed flag or a bad value fails here, not for a reader."""
    parse = argparse.ArgumentParser.parse_args

    def parsed(self, args=None, namespace=None):
        parse(self, args, namespace)
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parsed)
    monkeypatch.setattr(sys, "argv", [f"benchmarks/{script}.py", *words])
    try:
        load(script).main()
    except _Parsed:
        return
    except SystemExit:
        pytest.fail(f"{where}: python benchmarks/{script}.py {' '.join(words)}: {capsys.readouterr().err}")
    pytest.fail(f"{where}: benchmarks/{script}.py ran without parsing its arguments")


def test_the_docs_show_benchmark_commands():
    assert len({script for _, script, _ in benchmark_commands()}) >= 15


def test_every_code_block_the_site_shows_is_a_fenced_example(site):
    """An indented code block (or a fence the tests' reader misses) is rendered as code but
    neither run nor parsed: each ``<pre>`` of a built page is one of its page's fenced blocks."""
    fenced: dict[str, set[str]] = {}
    for example in examples():
        fenced.setdefault(example.page, set()).add(" ".join(example.code.split()))
    escaped = []
    for page in pages()[1:]:
        name = page.relative_to(ROOT / "docs").with_suffix("")
        built = site / ("index.html" if name.name == "index" and name.parent == Path(".") else
                        name.parent / "index.html" if name.name == "index" else name / "index.html")
        for block in re.findall(r"<pre[^>]*>(.*?)</pre>", built.read_text(), re.S):
            if " ".join(_text_keeping_space(block).split()) not in fenced.get(str(page.relative_to(ROOT)), set()):
                escaped.append(f"{page.relative_to(ROOT)}: {_text_keeping_space(block)[:80]!r}")
    assert not escaped, "code blocks that are not fenced examples:\n" + "\n".join(escaped)


def _text_keeping_space(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", fragment))


def test_the_docs_show_each_command():
    assert {command for _, command, _ in cli_commands()} == {"serve", "chat", "bench", "pull", "models", "launch"}
    assert len(cli_commands()) >= 15


@pytest.mark.parametrize("block", yaml_blocks(), ids=[block.id for block in yaml_blocks()])
def test_every_config_file_in_the_docs_is_read_as_the_server_reads_it(block, tmp_path):
    data = yaml.safe_load(block.code)
    if "models" in data:  # --config FILE: each entry's settings as a server of several models makes them
        path = tmp_path / "models.yaml"
        path.write_text(block.code)
        entries = read_config(path)
        assert [entry.name for entry in entries] == [item["name"] for item in data["models"]]
        for entry in entries:
            model_settings(ServeSettings(), entry)
    elif "scrape_configs" in data:  # Prometheus: the route, with a key (every route but /health needs one)
        for job in data["scrape_configs"]:
            assert job["metrics_path"] == "/metrics" and job["authorization"]["credentials_file"]
    else:  # a Ray Serve config: each application's args as the serve run builder takes them
        for app in data["applications"]:
            assert app["import_path"] == "glmserve.deploy.ray:build"
            assert not {"host", "port", "ray_address"} & set(app["args"])
            DeploySettings(**app["args"])


def test_the_readme_is_short_and_its_links_resolve():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    assert targets
    for target in targets:
        if not target.startswith("http"):
            assert (ROOT / target).exists(), target
    # every page of the docs is in the site's navigation (mkdocs --strict checks the links between them)
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in pages()[1:]:
        assert str(page.relative_to(ROOT / "docs")) in nav, page


def test_the_reference_pages_hold_what_the_code_renders():
    """The flag, route and metric tables are kept in the pages (they read on the code host too):
    ``python scripts/docs_hooks.py --check`` renders them from the code and compares."""
    proc = subprocess.run([sys.executable, "scripts/docs_hooks.py", "--check"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_troubleshooting_statuses_and_codes_are_the_servers():
    """Each status of the troubleshooting table is one a route declares (502: Ray Serve's
    proxy, outside the app's document), and each error code it names is one the code sends."""
    page = (ROOT / "docs" / "guides" / "troubleshooting.md").read_text()
    rows = [line.split("|")[1:3] for line in page.splitlines() if re.match(r"\| \d{3} \|", line)]
    declared = {int(s) for line in (ROOT / "docs" / "reference" / "routes.md").read_text().splitlines()
                if line.startswith("| ") and line.count("|") == 6 for s in re.findall(r"\b\d{3}\b", line.split("|")[4])}
    source = "\n".join(p.read_text() for p in (ROOT / "src" / "glmserve").rglob("*.py"))
    assert len(rows) == 12
    for status, codes in rows:
        assert int(status) in declared | {502}, status
        for code in re.findall(r"`([a-z_]+)`", codes):
            assert f'"{code}"' in source, code


COMMENT_LINE = re.compile(r"\s#.*$")


def _recipe_env(code: str) -> dict[str, str]:
    """The variables a shell block's ``export`` lines set (continuation lines joined)."""
    joined = code.replace("\\\n", " ")
    lines = [COMMENT_LINE.sub("", line) for line in joined.splitlines() if line.startswith("export ")]
    return dict(re.findall(r"(\w+)=(\S+)", " ".join(lines)))


@pytest.mark.parametrize("page", ["README.md", "docs/guides/coding-agents.md"])
def test_the_by_hand_claude_code_recipe_sets_what_launch_sets(page, tmp_path):
    # the interactive session's block (its last line: claude), on the served model at a 64k context
    blocks = [e for e in examples() if e.page == page and e.code.strip().splitlines()[-1:] == ["claude"]]
    assert len(blocks) == 1, page
    env, _ = agent_setup("claude", "http://127.0.0.1:8000", "glm-4.7-flash", "unused", tmp_path, 65536, environ={})
    assert _recipe_env(blocks[0].code) == {name: value for name, value in env.items() if value is not None}


def test_the_opencode_json_for_a_running_server_is_what_launch_gives_opencode(tmp_path):
    blocks = [e for e in examples() if e.page == "docs/guides/coding-agents.md" and e.language == "json"]
    assert len(blocks) == 1
    env, _ = agent_setup("opencode", "http://127.0.0.1:8000", "glm-4.7-flash", "unused", tmp_path, 65536, environ={})
    given = json.loads(env["OPENCODE_CONFIG_CONTENT"])
    # launch alone keeps the user's other providers out; the page says so
    assert given.pop("enabled_providers") == ["glmserve"] and given.pop("disabled_providers") == []
    assert json.loads(blocks[0].code) == given
