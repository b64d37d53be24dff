"""``glmserve bench``: a streaming load generator for any OpenAI-compatible server, reporting
TTFT, TPOT, ITL and throughput the way vLLM's serving benchmark defines them."""

from __future__ import annotations

import asyncio

from rich.console import Console

from glmserve.bench.report import plot, print_report, write_json
from glmserve.bench.runner import BenchError, run_all
from glmserve.settings.bench import BenchSettings


def run_bench(settings: BenchSettings, console: Console | None = None) -> int:
    """Run, print the tables, write ``--json``/``--plot``. Returns the exit status: 0, or 1 when
    the benchmark could not run or any request failed."""
    console = console or Console()
    model, summaries = asyncio.run(run_all(settings))
    print_report(console, settings, model, summaries)
    if settings.json_file:
        write_json(settings.json_file, settings, model, summaries)
    if settings.plot:
        plot(settings.plot, {settings.label or settings.url: summaries})
    return 1 if any(s.failed for s in summaries) else 0


__all__ = ["BenchError", "run_bench"]
