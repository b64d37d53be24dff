"""GGUFs converted by llama.cpp's converter, once per machine: ``converted_gguf`` is
``tests/hf_models.py``'s, with its result kept in the test model cache (``tests/model_cache.py``'s
folder, ``$GLMSERVE_TEST_CACHE``) as a file ``converted_gguf-KEY.gguf`` and copied to ``out``
from then on (a converter run is about 9 s here, most of it the converter importing torch; the
suite converts a dozen folders).

The key is a SHA-256 over every byte of the folder converted and of the converter (a model made
in a test has the same file names and sizes from one build to the next, so, unlike the trained
models' key, large files count by their bytes too), the converter's options, and
``tests/hf_models.py`` and this file. It lives apart from ``model_cache.py``, whose bytes are in
every trained model's key: a change here does not retrain them."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from tests import hf_models
from tests.model_cache import cache_dir

SOURCES = (Path(hf_models.__file__), Path(__file__))


def _feed(h: "hashlib._Hash", path: Path) -> None:
    """Every file under ``path`` (or ``path`` itself): its name, size and bytes."""
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    h.update(f"files {len(files)}\n".encode())
    for file in files:
        h.update(f"{file.relative_to(path).as_posix() if path.is_dir() else file.name} {file.stat().st_size}\n".encode())
        with open(file, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)


def key(folder: Path, converter: Path, options: dict) -> str:
    """The cache key of converting ``folder`` with ``converter`` and ``options`` (see the module docstring)."""
    h = hashlib.sha256(json.dumps(options, sort_keys=True).encode() + b"\n")
    for source in SOURCES:
        h.update(source.read_bytes())
    _feed(h, converter)
    _feed(h, folder)
    return h.hexdigest()


def converted_gguf(folder: Path, out: Path, converter: Path, **options) -> Path:
    """``hf_models.converted_gguf(folder, out, converter, **options)`` (the same arguments), built
    once per key and copied to ``out`` (its parent is created). Raises what it raises."""
    entry = cache_dir() / f"converted_gguf-{key(folder, converter, options)[:24]}.gguf"
    if not entry.is_file():
        entry.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=f".{entry.name}-", dir=entry.parent))
        try:
            hf_models.converted_gguf(folder, scratch / "model.gguf", converter, **options)
            os.replace(scratch / "model.gguf", entry)  # whole or not at all, as another process may race it
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(entry, out)
    return out
