"""LoRA adapters chosen per request by ``model`` (``--lora NAME=PATH``), on both engines: an
adapter changes the output; on transformers it equals the adapter merged into the weights and
shares batches with the base model, on llama_cpp (GGUF adapters) base and adapter requests take
turns; neither changes anyone's result. A misfit adapter stops start-up."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import openai
import pytest

from tests.conftest import RemoteServer

pytest.importorskip("peft")

PROMPTS = ["What is the capital of France?", "List three fruits.", "Name a famous painter.", "What is 2 + 2?"]


@pytest.fixture(scope="module")
def folders(smollm2_hf, tmp_path_factory):
    from tests.hf_models import lora_adapter, merged_folder

    root = tmp_path_factory.mktemp("lora")
    adapter = lora_adapter(smollm2_hf, root / "adapter")
    return {"base": smollm2_hf, "adapter": adapter, "merged": merged_folder(smollm2_hf, adapter, root / "merged")}


@pytest.fixture(scope="module")
def lora_server(folders):
    srv = RemoteServer("--engine", "transformers", "--model", str(folders["base"]), "--served-model-name", "base",
                       "--lora", f"tuned={folders['adapter']}")
    yield srv
    srv.stop()


def _messages(prompt: str) -> list[dict]:
    return [{"role": "system", "content": "You are a helpful AI assistant."}, {"role": "user", "content": prompt}]


def _answers(url: str, model: str) -> list[str]:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=300)
    return [client.chat.completions.create(model=model, messages=_messages(p), temperature=0, max_tokens=24)
            .choices[0].message.content for p in PROMPTS]


def test_models_lists_adapter_with_parent(lora_server):
    cards = {card.id: card for card in lora_server.client().models.list().data}
    assert set(cards) == {"base", "tuned"}
    assert cards["tuned"].parent == "base" and getattr(cards["base"], "parent", None) is None


def test_adapter_output_differs_from_base_and_equals_merged_weights(lora_server, folders):
    base = _answers(lora_server.url, "base")
    tuned = _answers(lora_server.url, "tuned")
    assert all(base) and all(tuned)
    assert tuned != base
    merged_server = RemoteServer("--engine", "transformers", "--model", str(folders["merged"]))
    try:
        assert _answers(merged_server.url, "merged") == tuned
    finally:
        merged_server.stop()


def test_mixed_batch_equals_each_alone(lora_server):
    alone = {model: _answers(lora_server.url, model) for model in ("base", "tuned")}
    client = openai.AsyncOpenAI(base_url=f"{lora_server.url}/v1", api_key="x", max_retries=0, timeout=300)

    async def ask(model: str, prompt: str) -> str:
        reply = await client.chat.completions.create(model=model, messages=_messages(prompt), temperature=0,
                                                     max_tokens=24)
        assert reply.model == model
        return reply.choices[0].message.content

    async def mixed():
        jobs = [(m, p) for p in PROMPTS for m in ("base", "tuned")]
        answers = await asyncio.gather(*(ask(m, p) for m, p in jobs))
        return {m: [a for (mm, _), a in zip(jobs, answers) if mm == m] for m in ("base", "tuned")}

    assert asyncio.run(mixed()) == alone


def test_unknown_model_is_404(lora_server):
    with pytest.raises(openai.NotFoundError):
        lora_server.client().chat.completions.create(model="tuned-2", messages=_messages("hi"), max_tokens=4)


@pytest.mark.parametrize("case", ["misfit", "not-an-adapter"])
def test_adapter_that_does_not_fit_stops_startup(smollm2_hf, tmp_path, case):
    from tests.hf_models import tiny_llama_lora

    path = tiny_llama_lora(tmp_path / "misfit") if case == "misfit" else tmp_path
    proc = subprocess.run([sys.executable, "-m", "glmserve", "serve", "--engine", "transformers", "--model",
                           str(smollm2_hf), "--lora", f"bad={path}", "--port", "0"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("glmserve: error: cannot start: LoRA adapter 'bad'"), proc.stderr
    assert ("does not match the base model" if case == "misfit" else "not a PEFT adapter folder") in last


# ---- llama_cpp: GGUF LoRA adapters ----------------------------------------------------------


@pytest.fixture
def gguf_server(gguf_adapter):
    """A fresh server per test: see the README's "known limit" on batching and cache reuse."""
    srv = RemoteServer("--lora", f"tuned={gguf_adapter}")
    yield srv
    srv.stop()


def test_gguf_adapter_is_listed_and_changes_output(gguf_server):
    from tests.conftest import DEFAULT_MODEL

    cards = {card.id: card for card in gguf_server.client().models.list().data}
    assert cards["tuned"].parent == DEFAULT_MODEL
    base, tuned = _answers(gguf_server.url, DEFAULT_MODEL), _answers(gguf_server.url, "tuned")
    assert all(tuned) and tuned != base


def test_gguf_adapter_and_base_requests_interleave_without_changing_results(gguf_adapter):
    """Each request alone, then all at once on a fresh server. Both start from an empty KV
    cache: after much reuse, llama.cpp may lay a sequence's cells out of position order, and its
    attention rounding follows cell order (the README's known limit), which is not what this
    test is about: every step must apply the right adapter, and no KV may cross groups."""
    from tests.conftest import DEFAULT_MODEL

    models = (DEFAULT_MODEL, "tuned")
    # --batch-invariant: at the default 512 tokens a step, a prompt batched with others is computed
    # by other llama.cpp kernels than alone, which may round a near-tie the other way
    first = RemoteServer("--lora", f"tuned={gguf_adapter}", "--batch-invariant")
    try:
        alone = {model: _answers(first.url, model) for model in models}
    finally:
        first.stop()

    async def ask(client: openai.AsyncOpenAI, model: str, prompt: str) -> str:
        reply = await client.chat.completions.create(model=model, messages=_messages(prompt), temperature=0,
                                                     max_tokens=24)
        return reply.choices[0].message.content

    async def mixed(url: str):
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=300)
        jobs = [(m, p) for p in PROMPTS for m in models]
        answers = await asyncio.gather(*(ask(client, m, p) for m, p in jobs))
        return {m: [a for (mm, _), a in zip(jobs, answers) if mm == m] for m in models}

    second = RemoteServer("--lora", f"tuned={gguf_adapter}", "--batch-invariant")
    try:
        assert asyncio.run(mixed(second.url)) == alone
    finally:
        second.stop()


def test_gguf_adapter_that_does_not_fit_stops_startup(tmp_path):
    from tests.hf_models import gguf_lora, tiny_llama_lora

    misfit = gguf_lora(tiny_llama_lora(tmp_path / "peft", ("v_proj", "o_proj")), tmp_path / "misfit.gguf")
    for path, reason in ((misfit, "does not match the base model"), (tmp_path / "none.gguf", "no such file")):
        proc = subprocess.run([sys.executable, "-m", "glmserve", "serve", "--lora", f"bad={path}", "--port", "0"],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 1
        last = proc.stderr.strip().splitlines()[-1]
        assert last.startswith("glmserve: error: cannot start: LoRA adapter 'bad'") and reason in last, proc.stderr
