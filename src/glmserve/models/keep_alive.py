"""Durations as Ollama's ``keep_alive`` spells them: ``--keep-alive``, a ``--config`` entry's
``keep_alive``, ``--store-ttl`` and a request's ``keep_alive``."""

from __future__ import annotations

import math
import re
from typing import Any

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_keep_alive(value: Any) -> float:
    """Seconds, from Ollama's ``keep_alive`` forms: a number (seconds), a duration string of
    ``ms``/``s``/``m``/``h``/``d`` parts, or a number as a string; negative means ``math.inf``.
    Raises ``ValueError``."""
    if isinstance(value, bool):
        raise ValueError(f"keep_alive: {value!r} is not a duration")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip()
        sign = -1.0 if text.startswith("-") else 1.0
        body = text.lstrip("+-")
        try:
            seconds = sign * float(body)
        except ValueError:
            parts = _DURATION.findall(body)
            if not parts or "".join(n + u for n, u in parts) != body:
                raise ValueError(f"keep_alive: {value!r} is not a duration (e.g. 300, \"5m\", \"1h30m\", -1)") from None
            seconds = sign * sum(float(n) * _UNIT_S[u] for n, u in parts)
    else:
        raise ValueError(f"keep_alive: {value!r} is not a duration")
    if math.isnan(seconds):
        raise ValueError("keep_alive: not a number")
    return math.inf if seconds < 0 else seconds
