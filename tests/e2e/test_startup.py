"""Start-up: a model that cannot be found or loaded stops with one line and a non-zero exit."""

from __future__ import annotations

import subprocess
import sys


def _serve(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "glmserve", "serve", "--port", "0", *args],
                          capture_output=True, text=True, timeout=120)


def _assert_one_line_failure(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode != 0
    err = proc.stderr.strip()
    assert "Traceback" not in proc.stderr + proc.stdout
    assert len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle in err


def test_missing_model_file(tmp_path):
    _assert_one_line_failure(_serve("--model", str(tmp_path / "nope.gguf")), "nope.gguf", "no such file")


def test_not_a_gguf_file(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"\0" * 16)
    _assert_one_line_failure(_serve("--model", str(path)), "not a .gguf")


def test_corrupt_gguf_file(tmp_path):
    path = tmp_path / "broken.gguf"
    path.write_bytes(b"GGUF" + b"\xff" * 64)
    _assert_one_line_failure(_serve("--model", str(path)), "cannot load")


def test_invalid_flag_value():
    _assert_one_line_failure(_serve("--n-ctx", "-3"))


def test_flag_the_engine_does_not_use():
    _assert_one_line_failure(_serve("--dtype", "float32"), "--dtype", "llama_cpp")
    _assert_one_line_failure(_serve("--engine", "transformers", "--max-num-batched-tokens", "32"),
                             "--max-num-batched-tokens", "transformers")
    _assert_one_line_failure(_serve("--engine", "transformers", "--kv-layout", "unified"),
                             "--kv-layout", "transformers")
    _assert_one_line_failure(_serve("--kv-layout", "paged"), "kv_layout")


def test_reasoning_budget_needs_a_template_that_reasons():
    """Known only once the model (and its template) is loaded: the last line says why."""
    proc = _serve("--reasoning-budget", "100")  # the default model's template writes no <think>
    assert proc.returncode != 0 and "Traceback" not in proc.stderr + proc.stdout
    assert proc.stderr.strip().splitlines()[-1] == (
        "glmserve: error: cannot start: --reasoning-budget needs a chat template that writes <think> reasoning; "
        "this model's does not")


def test_kv_cache_larger_than_memory_is_refused():
    # 1M tokens x 22.5 KiB a cell: beyond this machine's memory even shared (unified, which auto takes
    # when split would not fit); with split asked for, unified is what the error suggests
    _assert_one_line_failure(_serve("--max-num-seqs", "256", "--n-ctx", str(1 << 20)),
                             "KV cache (unified: 1048576 cells", "lower --n-ctx")
    _assert_one_line_failure(_serve("--max-num-seqs", "256", "--n-ctx", str(1 << 20), "--kv-layout", "split"),
                             "KV cache (split: 268435456 cells", "--kv-layout unified")


def test_help_lists_flags():
    proc = subprocess.run([sys.executable, "-m", "glmserve", "serve", "--help"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0
    for flag in ("--model", "--host", "--port", "--n-ctx", "--n-threads", "--served-model-name", "--api-key"):
        assert flag in proc.stdout


def test_ray_flags_without_replicas():
    _assert_one_line_failure(_serve("--replica-cpus", "2"), "needs Ray Serve replicas")


def test_ray_replicas_refuse_a_missing_model_before_starting_ray(tmp_path):
    _assert_one_line_failure(_serve("--replicas", "2", "--model", str(tmp_path / "nope.gguf")), "no such file")



def test_speculative_mtp_needs_nextn_layers():
    _assert_one_line_failure(_serve("--speculative", "mtp"), "--speculative mtp needs a GGUF with NextN (MTP) layers")
