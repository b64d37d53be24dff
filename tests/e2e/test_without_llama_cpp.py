"""The server without llama-cpp-python (the ``llama-cpp`` extra), as ``pip install
'.[vllm]'`` or ``'.[transformers]'`` leaves it: ``llama_cpp`` is made unimportable
by a ``sitecustomize`` on the server's PYTHONPATH (in the server process and in the processes it
spawns, such as vLLM's engine core). The transformers and vllm engines start and serve
``tool_choice: required`` and a ``json_schema`` response format (grammars are built by the
vendored converter and compiled by xgrammar); the default engine stops with the install hint."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jsonschema
import pytest

from tests.conftest import RemoteServer, vllm_server
from tests.e2e.test_tools import TEMPLATE, TOOLS, assert_valid_tool_calls

NAME = "smollm2-hf"
ASK = [{"role": "system", "content": "You are a helpful AI assistant."},
       {"role": "user", "content": "What is the weather like in Paris right now?"}]
CITY = {"type": "object", "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
        "required": ["city", "population"], "additionalProperties": False}


@pytest.fixture(scope="module")
def blocked_env(tmp_path_factory) -> dict[str, str]:
    """Environment whose Python processes cannot import ``llama_cpp``."""
    site = tmp_path_factory.mktemp("no-llama-cpp")
    (site / "sitecustomize.py").write_text('import sys\nsys.modules["llama_cpp"] = None  # import llama_cpp fails\n')
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path}


def test_the_block_works_and_the_core_imports(blocked_env):
    code = ("import glmserve.cli, glmserve.server.app, glmserve.serving.structured.grammar\n"
            "import glmserve.serving.messages.service\n"
            "try:\n    import llama_cpp\nexcept ImportError:\n    print('blocked')\n")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **blocked_env}, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "blocked"


def test_default_engine_stops_with_the_install_hint(blocked_env):
    out = subprocess.run([sys.executable, "-m", "glmserve", "serve", "--port", "1"], env={**os.environ, **blocked_env},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "engine 'llama_cpp' needs llama_cpp, which is not installed" in out.stderr
    assert ".[llama-cpp]" in out.stderr


def _check_constrained_outputs(server: RemoteServer) -> None:
    client = server.client()
    reply = client.chat.completions.create(model=NAME, messages=ASK, tools=TOOLS, tool_choice="required",
                                           temperature=0, max_tokens=120)
    assert_valid_tool_calls(reply)
    reply = client.chat.completions.create(
        model=NAME, temperature=0, max_tokens=80,
        messages=[ASK[0], {"role": "user", "content": "Describe Paris as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": CITY}})
    jsonschema.validate(json.loads(reply.choices[0].message.content), CITY)
    assert "llama_cpp" not in server.log()


def test_transformers_engine_serves_tools_and_json_schema(smollm2_hf, blocked_env):
    pytest.importorskip("xgrammar")
    server = RemoteServer("--engine", "transformers", "--model", str(smollm2_hf), "--served-model-name", NAME,
                          "--chat-template", str(TEMPLATE), env=blocked_env)
    try:
        _check_constrained_outputs(server)
    finally:
        server.stop()


def test_vllm_engine_serves_tools_and_json_schema(smollm2_hf, blocked_env):
    """Also: with --max-num-seqs, --max-num-batched-tokens and --max-queue unset, vLLM's own
    API-server defaults are in force (on CPU: 128 sequences per socket) and the queue is 8x."""
    server = vllm_server(smollm2_hf, "--served-model-name", NAME, "--n-ctx", "2048", "--chat-template", str(TEMPLATE),
                         env=blocked_env)
    try:
        from vllm.engine.arg_utils import EngineArgs
        from vllm.usage.usage_lib import UsageContext

        tokens, seqs = (d[UsageContext.OPENAI_API_SERVER] for d in EngineArgs.get_batch_defaults(world_size=1))
        (card,) = server.client().models.list().data
        limits = {k: card.model_extra[k] for k in ("max_num_seqs", "max_num_batched_tokens", "max_queue")}
        assert limits == {"max_num_seqs": seqs, "max_num_batched_tokens": tokens, "max_queue": 8 * seqs}
        assert seqs > 8
        _check_constrained_outputs(server)
    finally:
        server.stop()
