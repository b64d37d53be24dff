"""Serving metrics as vLLM's ``benchmarks/benchmark_serving.py`` defines them.

- TTFT: time from sending a request to its first content token.
- TPOT: per request, (latency - TTFT) / (output tokens - 1): time per output token after the first.
- ITL: every gap between two consecutive content chunks of a stream, all requests pooled.
- E2EL: request latency. Output throughput: all output tokens / wall time of the run.
Times are kept in seconds and reported in milliseconds.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field


@dataclass(slots=True)
class RequestResult:
    ok: bool
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft_s: float = 0.0
    latency_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)
    error: str = ""


def _percentile(values: list[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default), ``q`` in [0, 100]."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass(slots=True)
class Summary:
    """Mean/p50/p99 are milliseconds for ``*_ms``; throughputs per second."""

    concurrency: int
    completed: int
    failed: int
    duration_s: float
    mean_input_tokens: float
    total_output_tokens: int
    output_throughput: float
    request_throughput: float
    ttft_ms: dict[str, float]
    tpot_ms: dict[str, float]
    itl_ms: dict[str, float]
    e2el_ms: dict[str, float]

    def to_dict(self) -> dict:
        return asdict(self)


def _stats_ms(values_s: list[float]) -> dict[str, float]:
    ms = [v * 1000 for v in values_s]
    return {
        "mean": statistics.fmean(ms) if ms else float("nan"),
        "p50": _percentile(ms, 50),
        "p99": _percentile(ms, 99),
    }


def summarize(results: list[RequestResult], duration_s: float, concurrency: int) -> Summary:
    done = [r for r in results if r.ok]
    total_out = sum(r.output_tokens for r in done)
    tpots = [(r.latency_s - r.ttft_s) / (r.output_tokens - 1) for r in done if r.output_tokens > 1]
    return Summary(
        concurrency=concurrency,
        completed=len(done),
        failed=len(results) - len(done),
        duration_s=duration_s,
        mean_input_tokens=statistics.fmean(r.prompt_tokens for r in done) if done else 0.0,
        total_output_tokens=total_out,
        output_throughput=total_out / duration_s if duration_s > 0 else 0.0,
        request_throughput=len(done) / duration_s if duration_s > 0 else 0.0,
        ttft_ms=_stats_ms([r.ttft_s for r in done]),
        tpot_ms=_stats_ms(tpots),
        itl_ms=_stats_ms([gap for r in done for gap in r.itl_s]),
        e2el_ms=_stats_ms([r.latency_s for r in done]),
    )
