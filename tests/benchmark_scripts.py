"""The scripts of ``benchmarks/`` imported as modules, for the tests of their parts: ``load(NAME)``
imports ``benchmarks/NAME.py`` with ``benchmarks/`` on ``sys.path`` only while it is imported
(the scripts import their siblings, ``rounds`` and the like, by name)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def load(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` as a module (imported once, then the same module)."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCHMARKS))
