"""``glmserve bench`` against the real server."""

from __future__ import annotations

import json
import subprocess
import sys


def _bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "glmserve", "bench", *args], capture_output=True, text=True,
                          timeout=300)


def test_bench_reports_every_level(server, tmp_path):
    out_json, out_png = tmp_path / "r.json", tmp_path / "r.png"
    proc = _bench("--url", server.url, "--concurrency", "1,2", "--num-requests", "4", "--output-len", "8",
                  "--input-len", "16", "--ignore-eos", "--json", str(out_json), "--plot", str(out_png))
    assert proc.returncode == 0, proc.stderr
    for text in ("concurrency 1", "concurrency 2", "TTFT", "TPOT", "ITL", "output throughput", "hardware"):
        assert text in proc.stdout
    data = json.loads(out_json.read_text())
    assert data["model"] == "SmolLM2-135M-Instruct"
    assert [r["concurrency"] for r in data["results"]] == [1, 2]
    for r in data["results"]:
        assert r["completed"] == 4 and r["failed"] == 0
        assert r["total_output_tokens"] == 4 * 8  # ignore_eos: exactly output_len each
        assert r["ttft_ms"]["p50"] > 0 and r["output_throughput"] > 0
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_fails_clearly_when_requests_fail(server):
    proc = _bench("--url", server.url, "--model", "SmolLM2-135M-Instruct", "--num-requests", "2",
                  "--output-len", "4", "--input-len", "5000")  # prompts longer than the context
    assert proc.returncode == 1
    assert "warm-up request failed" in proc.stderr and "context_length_exceeded" in proc.stderr


def test_bench_unreachable_server_is_one_line():
    proc = _bench("--url", "http://127.0.0.1:9", "--num-requests", "1")
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
