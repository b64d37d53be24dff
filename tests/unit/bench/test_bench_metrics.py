"""Benchmark metrics follow vLLM's definitions (TTFT, TPOT, ITL, throughput)."""

from __future__ import annotations

import math

import pytest

from glmserve.bench.metrics import RequestResult, _percentile, summarize
from glmserve.bench.runner import api_base


def test_percentile_matches_linear_interpolation():
    values = [1.0, 2.0, 3.0, 4.0]
    assert _percentile(values, 50) == 2.5
    assert _percentile(values, 0) == 1.0 and _percentile(values, 100) == 4.0
    assert _percentile([5.0], 99) == 5.0
    assert math.isnan(_percentile([], 50))


def test_summary_figures():
    results = [
        # 0.1 s to first token, then 4 more tokens 0.05 s apart: latency 0.3 s, TPOT 0.05 s
        RequestResult(True, prompt_tokens=10, output_tokens=5, ttft_s=0.1, latency_s=0.3, itl_s=[0.05] * 4),
        RequestResult(True, prompt_tokens=20, output_tokens=3, ttft_s=0.3, latency_s=0.5, itl_s=[0.1, 0.1]),
        RequestResult(False, error="HTTP 429"),
    ]
    s = summarize(results, duration_s=2.0, concurrency=2)
    assert (s.completed, s.failed, s.total_output_tokens) == (2, 1, 8)
    assert s.output_throughput == pytest.approx(4.0)
    assert s.request_throughput == pytest.approx(1.0)
    assert s.mean_input_tokens == 15
    assert s.ttft_ms["mean"] == pytest.approx(200.0)
    assert s.tpot_ms["mean"] == pytest.approx((50.0 + 100.0) / 2)
    assert s.itl_ms["p50"] == pytest.approx(50.0)
    assert s.e2el_ms["p99"] == pytest.approx(300 + 200 * 0.99)


def test_single_token_outputs_have_no_tpot():
    s = summarize([RequestResult(True, 5, 1, 0.1, 0.1, [])], 1.0, 1)
    assert math.isnan(s.tpot_ms["mean"])


@pytest.mark.parametrize("url", ["http://h:1", "http://h:1/", "http://h:1/v1", "http://h:1/v1/"])
def test_api_base(url):
    assert api_base(url) == "http://h:1/v1/"
