"""``--engine transformers`` end to end: the SmolLM2 GGUF converted to a Hugging Face folder,
a tiny GLM-4 model, what the engine cannot do refused with a 400, and the missing-extra hint."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import jsonschema
import openai
import pytest

from tests.conftest import DEFAULT_MODEL, RemoteServer, greedy_streams
from tests.e2e.test_tools import SCHEMAS, TOOLS
from tests.hf_models import FIXTURES, GLM_ARCHITECTURES

pytest.importorskip("torch")

NAME = "smollm2"
SYSTEM = {"role": "system", "content": "You are a helpful AI assistant."}
PROMPTS = ["What is the capital of France?", "List three fruits.", "What is 2 + 2?", "Name a famous painter.",
           "Write a haiku about autumn.", "Tell me a joke about cats.", "Describe the ocean in a few words.",
           "Explain what a CPU does in one sentence."]


@pytest.fixture(scope="module")
def hf_server(smollm2_hf):
    srv = RemoteServer("--engine", "transformers", "--model", str(smollm2_hf), "--served-model-name", NAME,
                       "--chat-template", str(FIXTURES / "templates" / "chatml-hermes-tools.jinja"),
                       "--allow-runtime-lora-updating")
    yield srv
    srv.stop()


def _ask(client: openai.OpenAI, prompt: str, **kwargs):
    kwargs.setdefault("temperature", 0)
    kwargs.setdefault("model", NAME)
    return client.chat.completions.create(messages=[SYSTEM, {"role": "user", "content": prompt}],
                                          **kwargs)


def test_capital_of_france(hf_server):
    reply = _ask(hf_server.client(), "What is the capital of France?", max_tokens=40)
    assert "Paris" in reply.choices[0].message.content
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage.completion_tokens > 0 and reply.usage.prompt_tokens > 10


def test_stream_equals_plain(hf_server):
    client = hf_server.client()
    plain = _ask(client, "List three fruits.", max_tokens=40)
    stream = _ask(client, "List three fruits.", max_tokens=40, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        plain.choices[0].finish_reason]


def test_concurrent_greedy_streams_equal_sequential(hf_server):
    messages = [[SYSTEM, {"role": "user", "content": p}] for p in PROMPTS]
    sequential, concurrent = greedy_streams(hf_server.url, NAME, messages)
    assert all(sequential)
    assert concurrent == sequential


def test_seed_and_stop_and_max_tokens(hf_server):
    client = hf_server.client()
    a = _ask(client, "Tell me a story.", temperature=0.9, seed=7, max_tokens=24)
    b = _ask(client, "Tell me a story.", temperature=0.9, seed=7, max_tokens=24)
    assert a.choices[0].message.content == b.choices[0].message.content
    assert a.usage.completion_tokens == 24 and a.choices[0].finish_reason == "length"
    stopped = _ask(client, "What is the capital of France?", max_tokens=40, stop=["Paris"])
    assert "Paris" not in stopped.choices[0].message.content and stopped.choices[0].finish_reason == "stop"


def test_penalties_apply(hf_server):
    client = hf_server.client()
    prompt = "Count from 1 to 20, separated by commas."  # greedy: "1. 1\n2. 2\n3. 3..."
    plain = _ask(client, prompt, max_tokens=48).choices[0].message.content
    assert _ask(client, prompt, max_tokens=48, frequency_penalty=2.0).choices[0].message.content != plain
    assert _ask(client, prompt, max_tokens=48, presence_penalty=2.0).choices[0].message.content != plain


def test_constrained_decoding_with_xgrammar(hf_server):
    """tool_choice required/named (the hermes template's format) and response_format are
    constrained with xgrammar on this engine."""
    client = hf_server.client()
    for choice in ("required", {"type": "function", "function": {"name": "get_time"}}):
        reply = _ask(client, "What is the weather like in Paris right now?", max_tokens=120, tools=TOOLS,
                     tool_choice=choice)
        calls = reply.choices[0].message.tool_calls
        assert reply.choices[0].finish_reason == "tool_calls" and calls
        for call in calls:
            jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])
    schema = {"type": "object", "properties": {"population": {"type": "integer"}, "capital": {"type": "boolean"}},
              "required": ["population", "capital"], "additionalProperties": False}
    reply = _ask(client, "Describe Paris as JSON.", max_tokens=60, response_format={
        "type": "json_schema", "json_schema": {"name": "city", "schema": schema}})
    jsonschema.validate(json.loads(reply.choices[0].message.content), schema)


def test_lone_surrogate_is_400(hf_server):
    import httpx

    body = '{"model": "%s", "messages": [{"role": "user", "content": "hi \\ud800 there"}]}' % NAME
    resp = httpx.post(f"{hf_server.url}/v1/chat/completions", content=body,
                      headers={"content-type": "application/json"}, timeout=60)
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "messages"
    assert "surrogate" in resp.json()["error"]["message"]


def test_embeddings_agree_with_llama_cpp(hf_server, server):
    """The same texts on both engines: the HF folder is the GGUF's weights dequantized, so the
    vectors (mean-pooled, normalised last hidden states) point the same way; several inputs in
    one request equal single requests."""
    texts = ["The quick brown fox jumps over the lazy dog.", "def add(a, b):\n    return a + b"]
    hf = [d.embedding for d in hf_server.client().embeddings.create(model=NAME, input=texts).data]
    single = hf_server.client().embeddings.create(model=NAME, input=texts[1]).data[0].embedding
    assert max(abs(a - b) for a, b in zip(hf[1], single, strict=True)) < 1e-4
    gguf = server.client().embeddings.create(model=DEFAULT_MODEL, input=texts).data
    cosines = [sum(a * b for a, b in zip(h, g.embedding, strict=True)) for h, g in zip(hf, gguf)]
    assert min(cosines) > 0.99, cosines  # measured: 0.9993 and 0.9999
    assert sum(a * b for a, b in zip(hf[0], hf[1])) < 0.9  # different texts do not (0.48)


def test_runtime_lora_adapter(hf_server, smollm2_hf, tmp_path):
    """A PEFT adapter loaded at run time changes greedy answers; unloading the last adapter
    gives the base model back, answering as before; an adapter for another model is a 400
    and leaves the model as it was."""
    pytest.importorskip("peft")
    from tests.hf_models import lora_adapter, tiny_llama_lora

    client = hf_server.client()

    def answers(model: str) -> list[str]:
        return [_ask(client, p, model=model, max_tokens=24).choices[0].message.content for p in PROMPTS[:4]]

    def post(route: str, **body) -> httpx.Response:
        return httpx.post(f"{hf_server.url}/v1/{route}", json=body, timeout=120)

    base = answers(NAME)
    misfit = post("load_lora_adapter", lora_name="misfit", lora_path=str(tiny_llama_lora(tmp_path / "misfit")))
    assert misfit.status_code == 400 and "does not match the base model" in misfit.json()["error"]["message"]
    assert answers(NAME) == base
    adapter = lora_adapter(smollm2_hf, tmp_path / "adapter")
    assert post("load_lora_adapter", lora_name="tuned", lora_path=str(adapter)).status_code == 200
    assert [card.id for card in client.models.list().data] == [NAME, "tuned"]
    tuned = answers("tuned")
    assert all(tuned) and tuned != base
    assert answers(NAME) == base
    assert post("unload_lora_adapter", lora_name="tuned").status_code == 200
    assert [card.id for card in client.models.list().data] == [NAME]
    assert answers(NAME) == base
    assert post("unload_lora_adapter", lora_name="tuned").status_code == 404


def test_image_to_text_model_is_400(hf_server):
    with pytest.raises(openai.BadRequestError) as err:
        hf_server.client().chat.completions.create(model=NAME, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}])
    assert err.value.body["param"] == "messages.0.content.0"
    assert "image" in err.value.body["message"]


@pytest.mark.parametrize(("architecture", "template", "parser"), GLM_ARCHITECTURES,
                         ids=[a for a, _, _ in GLM_ARCHITECTURES])
def test_glm_models_load_natively(tmp_path_factory, architecture, template, parser):
    from tests.hf_models import tiny_glm4

    folder = tiny_glm4(tmp_path_factory.mktemp("glm4") / "tiny-glm4", architecture, template)
    srv = RemoteServer("--engine", "transformers", "--model", str(folder))
    try:
        client = srv.client()
        card = client.models.list().data[0]
        assert card.id == "tiny-glm4" and card.tool_call_parser == parser
        reply = client.chat.completions.create(model="tiny-glm4", messages=[{"role": "user", "content": "你好"}],
                                               max_tokens=12, temperature=0)
        assert reply.choices[0].finish_reason in ("stop", "length") and reply.usage.completion_tokens > 0
        if parser == "glm4":
            # [gMASK]<sop><|user|>\n + 2 characters (6 UTF-8 bytes: byte-level tokens) + <|assistant|>
            assert reply.usage.prompt_tokens == 2 + 1 + 1 + 6 + 1
        if architecture == "GlmMoeDsaForCausalLM":  # the indexer's key cache joins and leaves the padded batch
            # prompts whose greedy continuation by this random model is not whitespace alone
            asks = [[{"role": "user", "content": text}] for text in ("Hello", "What is the weather like in Paris?",
                                                                       "Tell me a story.")]
            sequential, concurrent = greedy_streams(srv.url, "tiny-glm4", asks, max_tokens=16, ignore_eos=True)
            assert all(sequential) and concurrent == sequential
    finally:
        srv.stop()


def test_gguf_file_loads_through_transformers():
    """No --model: the embedded GGUF, dequantized by transformers' gguf_file= loader."""
    srv = RemoteServer("--engine", "transformers")
    try:
        client = srv.client()
        assert client.models.list().data[0].id == DEFAULT_MODEL
        reply = client.chat.completions.create(model=DEFAULT_MODEL, temperature=0, max_tokens=40, messages=[
            SYSTEM, {"role": "user", "content": "What is the capital of France?"}])
        assert "Paris" in reply.choices[0].message.content
    finally:
        srv.stop()


def test_missing_extra_is_a_one_line_hint(tmp_path):
    shim = tmp_path / "torch"
    shim.mkdir()
    (shim / "__init__.py").write_text("raise ImportError('No module named torch', name='torch')\n")
    proc = subprocess.run([sys.executable, "-m", "glmserve", "serve", "--engine", "transformers", "--port", "0"],
                          capture_output=True, text=True, timeout=120, env={"PYTHONPATH": str(tmp_path),
                                                                            "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "torch" in lines[0] and "pip install '.[transformers]'" in lines[0]
