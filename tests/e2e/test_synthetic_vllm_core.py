"""``benchmarks/synthetic_vllm_core.py`` (``serving_overhead.py --vllm-core synthetic``) under the
installed vLLM's real ``AsyncLLM``: every request gets one token per step up to its
``max_tokens``, the tokens are its ordinary text, a slow reader is never handed merged deltas (the
steps wait for it), and neither a request left early nor one read whole at its end (vLLM's
server's non-streamed replies) stalls the others. Run in a subprocess with
``synthetic_site`` on its ``PYTHONPATH``, as the benchmark runs its servers: ``install()`` patches
vLLM for the whole process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.benchmark_scripts import BENCHMARKS

PROBE = """
import asyncio, json, sys
import synthetic_vllm_core as core  # installed by synthetic_site/sitecustomize.py, as on the benchmark's servers
from vllm import SamplingParams
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.sampling_params import RequestOutputKind
from vllm.v1.engine.async_llm import AsyncLLM

async def main(folder):
    llm = AsyncLLM.from_engine_args(AsyncEngineArgs(model=folder, dtype="float32", max_model_len=512,
                                                    enforce_eager=True))
    try:
        def params(kind=RequestOutputKind.DELTA):
            return SamplingParams(max_tokens=6, output_kind=kind, ignore_eos=True)

        async def run(name, delay, leave_after=None, kind=RequestOutputKind.DELTA):
            outs = []
            async for out in llm.generate("Say something.", params(kind), request_id=name):
                outs.append([len(out.outputs[0].token_ids), out.outputs[0].text, out.outputs[0].finish_reason])
                if leave_after is not None and len(outs) == leave_after:
                    break
                await asyncio.sleep(delay)
            return outs

        runs = await asyncio.wait_for(asyncio.gather(run("fast", 0), run("slow", 0.05), run("left", 0, 2),
                                                     run("whole", 0, kind=RequestOutputKind.FINAL_ONLY)), 60)
        after = await asyncio.wait_for(run("after", 0), 60)  # the one left early holds up nothing
        text = llm.get_tokenizer().decode(core.SyntheticCoreClient.current.tokens[:6])
        print(json.dumps({"runs": runs, "after": after, "text": text}))
    finally:
        llm.shutdown()

asyncio.run(main(sys.argv[1]))
"""


@pytest.fixture(scope="module")
def probe(smollm2_hf):
    pytest.importorskip("vllm")
    path = [str(BENCHMARKS / "synthetic_site"), str(BENCHMARKS), os.environ.get("PYTHONPATH")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, path))}
    done = subprocess.run([sys.executable, "-c", PROBE, str(smollm2_hf)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_each_request_gets_one_token_per_step_to_max_tokens(probe):
    fast, slow, _, _ = probe["runs"]
    for outs in (fast, slow, probe["after"]):
        assert [n for n, _, _ in outs] == [1] * 6  # the slow reader too: no merged deltas
        assert [reason for _, _, reason in outs] == [None] * 5 + ["length"]
        assert "".join(text for _, text, _ in outs) == probe["text"]
    assert probe["text"].startswith("The serving layer")


def test_a_request_left_early_stalls_nothing(probe):
    left = probe["runs"][2]
    assert [n for n, _, _ in left] == [1, 1]
    assert len(probe["after"]) == 6


def test_a_request_read_whole_stalls_nothing(probe):
    whole = probe["runs"][3]
    assert whole == [[6, probe["text"], "length"]]
