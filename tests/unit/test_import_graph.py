"""The import graph of ``src/glmserve``: no cycle, and every arrow points down the layers of
``LAYERS`` (entry points -> composition -> server -> runtime -> the API services -> the
generation pipeline -> settings -> chat formats, state -> engine -> models, protocol). Imports
inside functions and under ``TYPE_CHECKING`` count too: a lazy import that runs back up is
still an arrow up. A new cycle or arrow up fails here, naming its modules; so does a package
of more than 15 modules side by side."""

from __future__ import annotations

import ast
from pathlib import Path

import glmserve

SRC = Path(glmserve.__file__).parent.parent


def _modules() -> dict[str, Path]:
    out = {}
    for path in (SRC / "glmserve").rglob("*.py"):
        parts = path.relative_to(SRC).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The glmserve modules ``name`` imports (``from a.b import c`` is ``a.b.c`` when that is a
    module, else ``a.b``); relative imports resolved."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target not in modules and "." in target:
                target = target.rpartition(".")[0]
            if target in modules and target != name:
                found.add(target)
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_import_graph_has_no_cycle():
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert len(graph) > 100 and sum(map(len, graph.values())) > 300  # the whole package was read
    assert _cycles(graph) == []


# top to bottom: a module may import from its own layer (no cycle: above) or any layer below;
# a module belongs to the longest prefix that names it
LAYERS: tuple[tuple[str, ...], ...] = (
    ("glmserve.__main__", "glmserve.cli", "glmserve.launch", "glmserve.llm", "glmserve.deploy", "glmserve.client",
     "glmserve.bench", "glmserve.testing"),
    ("glmserve.composition",),
    ("glmserve.server",),
    ("glmserve.runtime",),
    ("glmserve.serving", "glmserve.serving.batches", "glmserve.serving.responses", "glmserve.serving.messages",
     "glmserve.serving.completions", "glmserve.serving.embeddings", "glmserve.serving.tokenize",
     "glmserve.serving.lora"),
    ("glmserve.serving.chat",),
    ("glmserve.serving.generation", "glmserve.serving.adapters", "glmserve.serving.items"),
    ("glmserve.serving.structured",),
    ("glmserve.settings", "glmserve.flags"),
    ("glmserve.chat", "glmserve.toolcalls", "glmserve.multimodal", "glmserve.state"),
    ("glmserve.engine",),
    ("glmserve.models", "glmserve.protocol", "glmserve.version", "glmserve.vendor"),
)
MAX_MODULES = 15


def _layer(module: str) -> int | None:
    if module == "glmserve":  # the package's own __init__: the public entry (``glmserve.LLM``)
        return 0
    found = [(len(prefix), i) for i, prefixes in enumerate(LAYERS) for prefix in prefixes
             if module == prefix or module.startswith(prefix + ".")]
    return max(found)[1] if found else None


def test_no_import_runs_back_up():
    modules = _modules()
    assert [name for name in modules if _layer(name) is None] == []  # a new package is given its layer
    up = [f"{name} -> {target}" for name, path in modules.items() for target in sorted(_imports(name, path, modules))
          if _layer(target) < _layer(name)]
    assert up == []


def test_an_arrow_up_is_found():
    assert _layer("glmserve.engine.llama_cpp.engine") > _layer("glmserve.settings.serve") > _layer("glmserve.server")
    assert _layer("glmserve.serving.chat.service") < _layer("glmserve.serving.generation.prompt")
    assert _layer("glmserve.nothing") is None


def test_no_package_holds_more_than_15_modules():
    crowded = {}
    for folder in (SRC / "glmserve").rglob("*"):
        if folder.is_dir() and folder.name != "__pycache__":
            count = len([p for p in folder.glob("*.py") if p.name != "__init__.py"])
            if count > MAX_MODULES:
                crowded[folder.relative_to(SRC).as_posix()] = count
    assert crowded == {}


def test_a_cycle_is_found():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
