"""``benchmarks/compare_vllm_serve.py --engine-steps``: the hook it puts on both servers'
``PYTHONPATH`` wraps the installed vLLM's ``Scheduler.schedule`` and logs each step that ran
tokens, and ``StepLog`` reads a level's steps back."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.benchmark_scripts import load


# run with the hook as sitecustomize: the schedule it wraps is swapped for one giving two
# steps (33 new requests and 2048 tokens, then a decode step) and one empty step
PROBE = """
import types, sitecustomize
from vllm.v1.core.sched import scheduler
assert scheduler.Scheduler.schedule.__module__ == "sitecustomize", scheduler.Scheduler.schedule.__module__
outs = iter([(2048, 33), (64, 0), (0, 0)])
def fake(self, *args, **kwargs):
    tokens, new = next(outs)
    return types.SimpleNamespace(total_num_scheduled_tokens=tokens, scheduled_new_reqs=[None] * new)
sitecustomize._schedule = fake
for _ in range(3):
    scheduler.Scheduler.schedule(None)
"""


def _compare():
    return load("compare_vllm_serve")


def test_hook_logs_each_step_that_ran_tokens(tmp_path):
    compare = _compare()
    (tmp_path / "sitecustomize.py").write_text(compare.STEP_HOOK)
    log = compare.StepLog(tmp_path, "system0")
    log.path.write_text("1.0 62 1\n")  # a step of the level before
    mark = log.mark()
    subprocess.run([sys.executable, "-c", PROBE], env={**os.environ, **log.env(tmp_path)}, check=True, timeout=300)
    lines = log.path.read_text().splitlines()[mark:]
    assert [line.split()[1:] for line in lines] == [["2048", "33"], ["64", "0"]]
    steps = log.since(mark)
    assert steps["steps"] == 2 and steps["prefills"] == "33"


def test_steps_since_a_mark(tmp_path):
    log = _compare().StepLog(tmp_path, "system1")
    log.path.write_text("1.0 62 1\n2.0 2048 33\n7.0 64 0\n7.25 64 0\n7.75 1000 15\n9.0 64 0\n")
    assert log.mark() == 6
    # decode steps: 7.0 to 7.25 and 7.25 to 7.75 (the last step has no end)
    assert log.since(1) == {"steps": 5, "decode_step_ms": 375.0, "prefills": "33+15"}
    assert log.since(6) == {"steps": 0, "decode_step_ms": 0.0, "prefills": ""}
