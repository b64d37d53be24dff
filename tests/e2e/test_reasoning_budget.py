"""A thinking budget on real engines: a model that would reason on and on (its generation
prompt opens ``<think>`` and it never writes ``</think>``) is stopped after the budget, the
end-of-reasoning marker is written and an answer follows. llama_cpp runs the embedded SmolLM2
with a chat template that opens the reasoning; transformers a tiny random GLM on GLM-4.7's
template. The count is exact: the engine returns one logprob per token it sampled, and the
marker's tokens, written by glmserve, have none."""

from __future__ import annotations


import httpx
import openai
import pytest

from tests.conftest import RemoteServer

BUDGET, ANSWER_TOKENS = 1024, 16
# ChatML whose generation prompt opens the reasoning (as Qwen3 thinking models and R1 distills do)
THINKING_CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content.split('</think>')[-1] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}")


def _reasoning_is_cut_at_the_budget(srv: RemoteServer, model: str) -> None:
    client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0, timeout=600)
    marker = len(httpx.post(f"{srv.url}/tokenize", json={"model": model, "prompt": "</think>"}).json()["tokens"])
    # ignore_eos: the answer is ANSWER_TOKENS long whatever the model would do after the marker
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Think about the sea."}], temperature=0,
        max_tokens=BUDGET + marker + ANSWER_TOKENS, logprobs=True,
        extra_body={"thinking_token_budget": BUDGET, "ignore_eos": True})
    choice = reply.choices[0]
    sampled = len(choice.logprobs.content)
    assert sampled == BUDGET + ANSWER_TOKENS  # the reasoning's tokens, then the answer's
    assert reply.usage.completion_tokens == sampled + marker  # and the marker between them
    assert choice.message.model_extra["reasoning_content"] and choice.message.content
    assert "</think>" not in choice.message.content and choice.finish_reason == "length"


def test_llama_cpp(tmp_path):
    template = tmp_path / "thinking.jinja"
    template.write_text(THINKING_CHATML)
    # the loop guard off: SmolLM2's greedy reasoning loops within the budget, and the guard would end it first
    srv = RemoteServer("--chat-template", str(template), "--served-model-name", "smol-thinker", "--loop-guard", "off")
    try:
        _reasoning_is_cut_at_the_budget(srv, "smol-thinker")
    finally:
        srv.stop()


def test_transformers(tmp_path):
    pytest.importorskip("torch")
    from tests.hf_models import tiny_glm4

    folder = tiny_glm4(tmp_path / "tiny-glm47", template="glm-4.7.jinja", context=2048)
    srv = RemoteServer("--engine", "transformers", "--model", str(folder), "--served-model-name", "tiny-glm47",
                       "--loop-guard", "off")
    try:
        _reasoning_is_cut_at_the_budget(srv, "tiny-glm47")
    finally:
        srv.stop()
