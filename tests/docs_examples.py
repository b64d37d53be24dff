"""The examples in the docs (``docs/**/*.md``) and the README, as the tests read them.

An example is a fenced ``sh``, ``bash`` or ``python`` block. It talks to a server when it names
the docs' server address (``http://127.0.0.1:8000`` or ``localhost:8000``) or runs ``claude`` or
``codex``. Such a block may be preceded by ``<!-- not run here: REASON -->`` when it cannot run
against the default model on a CPU; every other one is run by ``tests/e2e/test_docs_examples.py``.
Each ``glmserve`` command (``serve``, ``chat``, ``bench``, ``pull``, ``models``, ``launch``) of a
shell block, a systemd unit or a Dockerfile is parsed with that command's flag parser, and each
YAML block (a ``--config`` file, a Ray Serve config) is read as the server reads it
(``tests/e2e/test_docs.py``), so a renamed or removed flag fails a test, not a reader; each
``python benchmarks/NAME.py`` command, in a block or inline, is parsed by that script's own
argument parser. Every code
block the site shows must be a fenced one (an indented block would escape all this).
"""

from __future__ import annotations

import itertools
import json
import re
import shlex
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LANGUAGES = {"sh", "bash", "python"}
SERVER = re.compile(r"(?:https?://)?(?:127\.0\.0\.1|localhost):8000")
AGENT = re.compile(r"^\s*(?:\S+=\S+\s+)*(?:claude|codex)\b", re.M)
COMMENT = re.compile(r"(?:^|\s)#.*$", re.M)
NOT_RUN = re.compile(r"<!-- not run here: (.+?) -->\s*$")
COMMANDS = ("serve", "chat", "bench", "pull", "models", "launch")  # glmserve's commands the tests parse
# a fenced block, at the margin or indented inside a list item (its lines then share the fence's indent)
FENCE = re.compile(r"^( *)```(\w*)[^\n]*\n(.*?)^\1```\s*$", re.M | re.S)


@dataclass(frozen=True)
class Example:
    """One fenced block: ``page`` (path from the repository root), ``line`` (its fence's line,
    1-based), ``language``, ``code``, and ``not_run`` (the reason given, or None)."""

    page: str
    line: int
    language: str
    code: str
    not_run: str | None

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def talks_to_server(self) -> bool:
        code = COMMENT.sub("", self.code)  # "serves on 127.0.0.1:8000" in a comment is no request
        return self.language in LANGUAGES and bool(SERVER.search(code) or AGENT.search(code))


def pages() -> list[Path]:
    """The README and every page of the docs."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def examples() -> list[Example]:
    """Every fenced block of every page, in order."""
    found = []
    for path in pages():
        text = path.read_text()
        for match in FENCE.finditer(text):
            before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
            reason = NOT_RUN.match(before)
            code = textwrap.dedent(match.group(3)) if match.group(1) else match.group(3)
            found.append(Example(str(path.relative_to(ROOT)), text.count("\n", 0, match.start()) + 1,
                                 match.group(2), code, reason.group(1) if reason else None))
    return found


def cli_commands() -> list[tuple[str, str, list[str]]]:
    """Each ``glmserve serve|chat|bench|pull|models|launch`` command of a shell block, a systemd
    unit's ``ExecStart=`` or a Dockerfile's ``CMD [...]``: (where, the command, its words after
    it), continuation lines joined, a trailing ``#`` comment, redirections and what follows a
    ``|``, ``&&`` or ``;`` dropped."""
    commands = []
    for example in examples():
        if example.language not in {"sh", "bash", "ini", "dockerfile"}:
            continue
        for line in example.code.replace("\\\n", " ").splitlines():
            if not re.search(rf"glmserve\W+(?:{'|'.join(COMMANDS)})\b", line):
                continue
            if re.match(r"(?:CMD|ENTRYPOINT)\s*\[", line):  # a Dockerfile's exec form: a JSON list
                words = json.loads(line.split(None, 1)[1])
            else:
                words = shlex.split(line, comments=True)
            for at, word in enumerate(words[:-1]):
                if re.split(r"[=/]", word)[-1] == "glmserve" and words[at + 1] in COMMANDS:
                    rest = list(itertools.takewhile(lambda w: w not in {"|", "&&", ";"}, words[at + 2:]))
                    commands.append((example.id, words[at + 1], _without_redirections(rest)))
                    break
    return commands


BENCHMARK = re.compile(r"\bpython3? benchmarks/(\w+)\.py\b([^\n]*)")
INLINE = re.compile(r"(?<!`)`([^`]+)`(?!`)")


def benchmark_commands() -> list[tuple[str, str, list[str]]]:
    """Each ``python benchmarks/NAME.py ...`` command of a page: in a shell block (continuation
    lines joined, as ``cli_commands``) or in an inline code span (a span may wrap across lines;
    ``[--flag]``, an optional flag, is read as the flag): (where, NAME, its words)."""
    commands = []
    for example in examples():
        if example.language in {"sh", "bash"}:
            for line in example.code.replace("\\\n", " ").splitlines():
                commands += [(example.id, name, _words(rest)) for name, rest in BENCHMARK.findall(line)]
    for path in pages():
        text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), path.read_text())
        for span in INLINE.finditer(text):
            where = f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, span.start()) + 1}"
            code = " ".join(span.group(1).split())
            commands += [(where, name, [w.strip("[]") for w in _words(rest)]) for name, rest in BENCHMARK.findall(code)]
    return commands


def _words(rest: str) -> list[str]:
    words = shlex.split(rest, comments=True)
    return _without_redirections(list(itertools.takewhile(lambda w: w not in {"|", "&&", ";"}, words)))


def _without_redirections(words: list[str]) -> list[str]:
    """A command's words without its shell redirections (``> out.log``, ``2> err.log``, ``&``)."""
    kept, skip = [], False
    for word in words:
        if skip:
            skip = False
        elif re.fullmatch(r"\d*>>?|&", word):
            skip = word != "&"
        elif not re.match(r"\d*>>?\S", word):
            kept.append(word)
    return kept


def yaml_blocks() -> list[Example]:
    """The YAML blocks: a ``--config`` file of a server of several models, or a Ray Serve config."""
    return [example for example in examples() if example.language == "yaml"]
