"""Test models built once per machine: a builder of ``tests/hf_models.py`` decorated with
``cached`` writes its folder into ``$GLMSERVE_TEST_CACHE`` (default
``~/.cache/glmserve-tests``) under a key made of what the model is made from, and a later call
with the same inputs copies that folder to its ``out`` instead of training or converting again.

The key is a SHA-256 over: the builder's name; ``tests/hf_models.py``, ``tests/model_cache.py``
and the fixtures the builders read (templates, GLM tokenizer), so that a change to how any model
is built builds anew; the versions of torch and transformers; and every argument but ``out``,
where a path counts by its files (a small file by its bytes, a large one, such as converted
weights, by its name and size). A build writes into a temporary folder renamed into place, so
an interrupted build leaves nothing a later run would take for a model.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import inspect
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

TESTS = Path(__file__).parent
# files whose change changes what a builder makes
SOURCES = (TESTS / "hf_models.py", TESTS / "model_cache.py", TESTS / "unit" / "glm_tokenizer.py")
SMALL_FILE = 1 << 20


def cache_dir() -> Path:
    return Path(os.environ.get("GLMSERVE_TEST_CACHE") or Path.home() / ".cache" / "glmserve-tests")


def _feed_path(h: "hashlib._Hash", path: Path) -> None:
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path] if path.exists() else []
    h.update(f"path {len(files)}\n".encode())
    for file in files:
        rel = file.relative_to(path).as_posix() if path.is_dir() else file.name
        size = file.stat().st_size
        h.update(f"{rel} {size}\n".encode())
        if size <= SMALL_FILE:
            h.update(file.read_bytes())


def _feed(h: "hashlib._Hash", value: Any) -> None:
    if isinstance(value, Path):
        _feed_path(h, value)
    elif isinstance(value, (list, tuple)):
        h.update(f"seq {len(value)}\n".encode())
        for item in value:
            _feed(h, item)
    else:
        h.update(json.dumps(value, sort_keys=True, default=repr).encode() + b"\n")


def key(name: str, arguments: dict[str, Any]) -> str:
    """The cache key of builder ``name`` called with ``arguments`` (``out`` left out)."""
    import torch
    import transformers

    h = hashlib.sha256(f"{name}\ntorch {torch.__version__}\ntransformers {transformers.__version__}\n".encode())
    for source in SOURCES:
        h.update(source.read_bytes())
    for fixture in sorted((TESTS / "fixtures").rglob("*")):
        if fixture.is_file():
            h.update(fixture.relative_to(TESTS).as_posix().encode() + fixture.read_bytes())
    for arg in sorted(arguments):
        h.update(f"arg {arg}\n".encode())
        _feed(h, arguments[arg])
    return h.hexdigest()


def cached(builder: Callable[..., Path]) -> Callable[..., Path]:
    """``builder(..., out, ...) -> out`` made to build into the cache once per key and copy
    the cached folder to ``out`` (a new folder; its parent is created)."""
    signature = inspect.signature(builder)

    @functools.wraps(builder)
    def build(*args: Any, **kwargs: Any) -> Path:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        arguments = dict(bound.arguments)
        out = Path(arguments.pop("out"))
        entry = cache_dir() / f"{builder.__name__}-{key(builder.__name__, arguments)[:24]}"
        if not entry.is_dir():
            entry.parent.mkdir(parents=True, exist_ok=True)
            scratch = Path(tempfile.mkdtemp(prefix=f".{entry.name}-", dir=entry.parent))
            try:
                bound.arguments["out"] = scratch / "model"
                builder(*bound.args, **bound.kwargs)
                try:
                    os.rename(scratch / "model", entry)
                except OSError:  # another process put the same model there first
                    if not entry.is_dir():
                        raise
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(entry, out)
        return out

    return build


@contextlib.contextmanager
def fixed_home(name: str) -> Iterator[Path]:
    """An empty folder at the same path on every run (``<tmp>/glmserve-tests/<name>``), held
    under an exclusive lock until the block ends: the home and working directory of an agent
    whose captured prompt (which names its working directory) a cached model is trained on, so
    that the next run on the same day sends the same prompt and finds the model built."""
    root = Path(tempfile.gettempdir()) / "glmserve-tests"
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        home = root / name
        shutil.rmtree(home, ignore_errors=True)
        home.mkdir()
        try:
            yield home
        finally:
            shutil.rmtree(home, ignore_errors=True)
