"""Logprobs are the model's: glmserve's log-probabilities against ``torch.log_softmax`` of
transformers' logits for the same prompt, on the SmolLM2 weights converted to a Hugging Face
folder (dequantized from the GGUF). The transformers engine runs those very weights in float32:
equal within 1e-4. llama_cpp runs the Q4_1 GGUF (quantized matmuls): the same top-3 tokens, the
top token's log-probability within 0.05 and the others within 0.25 (measured: 0.001-0.009 and
0.02-0.21 on these prompts). Shapes through the official client: chat (plain and streamed)
and completions."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import DEFAULT_MODEL, RemoteServer

torch = pytest.importorskip("torch")
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]


@pytest.fixture(scope="module")
def reference(smollm2_hf):
    """{prompt token ids (tuple): [(token id, logprob)] x 3} from transformers in float32."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(smollm2_hf, dtype=torch.float32)

    def top3(ids: list[int]) -> list[tuple[int, float]]:
        with torch.no_grad():
            logprobs = torch.log_softmax(model(torch.tensor([ids])).logits[0, -1].float(), -1)
        values, indices = torch.topk(logprobs, 3)
        return list(zip(indices.tolist(), values.tolist()))

    return top3


@pytest.fixture(scope="module")
def hf_server(smollm2_hf):
    server = RemoteServer("--engine", "transformers", "--model", str(smollm2_hf), "--served-model-name", "hf",
                          "--dtype", "float32")
    yield server
    server.stop()


def _first_token_top3(server, model: str, prompt: str) -> tuple[list[int], list[tuple[str, float]]]:
    ids = httpx.post(f"{server.url}/tokenize", json={"prompt": prompt}, timeout=60).json()["tokens"]
    reply = server.client().completions.create(model=model, prompt=ids, max_tokens=1, temperature=0, logprobs=3)
    return ids, list(reply.choices[0].logprobs.top_logprobs[0].items())


def _detok(server, token_id: int) -> str:
    return httpx.post(f"{server.url}/detokenize", json={"tokens": [token_id]}, timeout=60).json()["prompt"]


@pytest.mark.parametrize("engine", ["transformers", "llama_cpp"])
def test_logprobs_match_torch(engine, reference, server, hf_server):
    srv, model = (hf_server, "hf") if engine == "transformers" else (server, DEFAULT_MODEL)
    first, rest = (1e-4, 1e-4) if engine == "transformers" else (0.05, 0.25)
    for prompt in PROMPTS:
        ids, ours = _first_token_top3(srv, model, prompt)
        expected = reference(ids)
        assert [text for text, _ in ours] == [_detok(srv, tid) for tid, _ in expected], prompt
        for rank, ((_, got), (_, want)) in enumerate(zip(ours, expected)):
            assert abs(got - want) <= (first if rank == 0 else rest), (prompt, rank, got, want)


def test_chat_logprobs_plain_and_streamed(client):
    kw = {"model": DEFAULT_MODEL, "messages": [{"role": "user", "content": "What is the capital of France?"}],
          "max_tokens": 8, "temperature": 0, "logprobs": True, "top_logprobs": 3}
    reply = client.chat.completions.create(**kw)
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens
    assert "".join(e.token for e in content) == reply.choices[0].message.content
    for entry in content:
        assert entry.logprob <= 0 and bytes(entry.bytes).decode() == entry.token
        assert len(entry.top_logprobs) == 3 and entry.top_logprobs[0].logprob >= entry.top_logprobs[-1].logprob
        assert entry.logprob == entry.top_logprobs[0].logprob  # greedy: the sampled token is the most likely
    streamed = [e for chunk in client.chat.completions.create(**kw, stream=True)
                for c in chunk.choices if c.logprobs for e in c.logprobs.content]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in content]
    plain = client.chat.completions.create(**{**kw, "logprobs": False, "top_logprobs": None})
    assert plain.choices[0].logprobs is None


def test_completion_logprobs_shape(client):
    reply = client.completions.create(model=DEFAULT_MODEL, prompt="The capital of France is", max_tokens=4,
                                      temperature=0, logprobs=2)
    lp = reply.choices[0].logprobs
    assert "".join(lp.tokens) == reply.choices[0].text and len(lp.token_logprobs) == 4
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(4)]
    assert all(len(top) == 2 for top in lp.top_logprobs)
