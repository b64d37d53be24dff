"""Print, save and plot benchmark results."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

from rich.console import Console
from rich.table import Table

from glmserve.bench.metrics import Summary
from glmserve.settings.bench import BenchSettings


def hardware() -> str:
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} CPUs"


def header(settings: BenchSettings, model: str) -> str:
    rate = "max" if settings.request_rate == float("inf") else f"{settings.request_rate:g}/s"
    return (f"{settings.label or settings.url} | model {model} | hardware: {hardware()} | input ~{settings.input_len} "
            f"tokens, output {settings.output_len}{' (ignore_eos)' if settings.ignore_eos else ''} | "
            f"{settings.num_requests} requests per level | rate {rate} | temperature {settings.temperature:g}")


def level_table(s: Summary) -> Table:
    table = Table(title=f"concurrency {s.concurrency}", title_justify="left")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, value in [
        ("requests ok / failed", f"{s.completed} / {s.failed}"),
        ("duration (s)", f"{s.duration_s:.2f}"),
        ("mean prompt tokens", f"{s.mean_input_tokens:.1f}"),
        ("output tokens", f"{s.total_output_tokens}"),
        ("output throughput (tok/s)", f"{s.output_throughput:.1f}"),
        ("request throughput (req/s)", f"{s.request_throughput:.2f}"),
    ]:
        table.add_row(name, value)
    for name, stats in [("TTFT", s.ttft_ms), ("TPOT", s.tpot_ms), ("ITL", s.itl_ms), ("E2E latency", s.e2el_ms)]:
        table.add_row(f"{name} mean / p50 / p99 (ms)",
                      f"{stats['mean']:.1f} / {stats['p50']:.1f} / {stats['p99']:.1f}")
    return table


def summary_table(summaries: list[Summary]) -> Table:
    table = Table(title="summary", title_justify="left")
    for col in ("concurrency", "ok", "failed", "out tok/s", "req/s", "TTFT p50 ms", "TTFT p99 ms",
                "TPOT p50 ms", "ITL p50 ms"):
        table.add_column(col, justify="right")
    for s in summaries:
        table.add_row(str(s.concurrency), str(s.completed), str(s.failed), f"{s.output_throughput:.1f}",
                      f"{s.request_throughput:.2f}", f"{s.ttft_ms['p50']:.1f}", f"{s.ttft_ms['p99']:.1f}",
                      f"{s.tpot_ms['p50']:.1f}", f"{s.itl_ms['p50']:.1f}")
    return table


def print_report(console: Console, settings: BenchSettings, model: str, summaries: list[Summary]) -> None:
    console.print(header(settings, model))
    for s in summaries:
        console.print(level_table(s))
    console.print(summary_table(summaries))


def write_json(path: str, settings: BenchSettings, model: str, summaries: list[Summary]) -> None:
    data = {
        "label": settings.label or settings.url,
        "url": settings.url,
        "model": model,
        "hardware": hardware(),
        "settings": settings.model_dump(mode="json", exclude={"api_key"}),
        "results": [s.to_dict() for s in summaries],
    }
    Path(path).write_text(json.dumps(data, indent=2))


def plot(path: str, series: dict[str, list[Summary]]) -> None:
    """Output throughput and p50 TTFT against concurrency, one line per system.
    Raises ``ImportError`` when matplotlib is missing."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for label, summaries in series.items():
        xs = [s.concurrency for s in summaries]
        left.plot(xs, [s.output_throughput for s in summaries], marker="o", label=label)
        right.plot(xs, [s.ttft_ms["p50"] for s in summaries], marker="o", label=label)
    left.set(xlabel="concurrency", ylabel="output tokens/s", title="Throughput")
    right.set(xlabel="concurrency", ylabel="p50 TTFT (ms)", title="Time to first token")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
