"""Image input end to end on a tiny random LLaVA (``--engine transformers``): data URLs and
http URLs from a local site (allowed by flag), image tokens in the prompt and in usage, and every
unsafe or broken image refused with a 400."""

from __future__ import annotations

import base64
import importlib.util
import json
import subprocess
import sys

import httpx
import openai
import pytest

from tests.conftest import RemoteServer
from tests.image_site import PNG, REQUESTS, encode, image_site

pytest.importorskip("torch")

MODEL = "tiny-llava"
IMAGE_TOKENS = 4  # 28x28 px in 14 px patches, CLS dropped
DATA_URL = "data:image/png;base64," + base64.b64encode(encode("JPEG", size=(40, 30))).decode()


@pytest.fixture(scope="module")
def llava(smollm2_hf, tmp_path_factory):
    from tests.hf_models import tiny_llava

    return tiny_llava(smollm2_hf, tmp_path_factory.mktemp("vision") / MODEL)


@pytest.fixture(scope="module")
def site():
    with image_site() as url:
        yield url


@pytest.fixture(scope="module")
def vision_server(llava):
    srv = RemoteServer("--engine", "transformers", "--model", str(llava), "--allowed-media-domains", "127.0.0.1",
                       "--max-image-bytes", "100000", "--max-image-pixels", "1000000", "--image-fetch-timeout", "1",
                       "--max-images-per-request", "3", "--max-image-pixels-per-request", "2500000")
    yield srv
    srv.stop()


def _message(*urls: str, text: str = "What is in this picture?") -> list[dict]:
    parts = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


def _ask(server: RemoteServer, *urls: str, **kwargs):
    kwargs.setdefault("max_tokens", 8)
    return server.client().chat.completions.create(model=MODEL, messages=_message(*urls), temperature=0, **kwargs)


def test_data_url_image_counts_its_image_tokens(vision_server):
    without = _ask(vision_server)
    with_image = _ask(vision_server, DATA_URL)
    assert with_image.usage.prompt_tokens - without.usage.prompt_tokens == IMAGE_TOKENS
    assert with_image.choices[0].finish_reason in ("stop", "length")
    assert with_image.usage.completion_tokens > 0


def test_http_and_data_images_in_order(vision_server, site):
    one = _ask(vision_server, f"{site}/ok.png")
    two = _ask(vision_server, f"{site}/ok.png", DATA_URL)
    assert two.usage.prompt_tokens - one.usage.prompt_tokens == IMAGE_TOKENS
    swapped = _ask(vision_server, DATA_URL, f"{site}/ok.png")
    assert swapped.usage.prompt_tokens == two.usage.prompt_tokens


def test_images_change_the_answer_and_stream_equals_plain(vision_server, site):
    red = "data:image/png;base64," + base64.b64encode(PNG).decode()
    answers = {u: _ask(vision_server, u, max_tokens=16) for u in (red, DATA_URL)}
    stream = _ask(vision_server, red, max_tokens=16, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == answers[red].choices[0].message.content
    assert answers[red].choices[0].message.content != answers[DATA_URL].choices[0].message.content


def test_images_a_tool_returns_reach_the_model_on_messages(vision_server):
    """Claude Code's Read tool on image files: the images inside a tool_result are the model's
    input (one more image, IMAGE_TOKENS more prompt tokens; a different image, another answer)."""
    import anthropic

    def image(data: bytes) -> dict:
        return {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                            "data": base64.b64encode(data).decode()}}

    def read(*images: dict):
        use = {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"file_path": "a.png"}}
        messages = [{"role": "user", "content": "Describe a.png"}, {"role": "assistant", "content": [use]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [
                        {"type": "text", "text": "a.png"}, *images]}]}]
        client = anthropic.Anthropic(base_url=vision_server.url, api_key="unused", max_retries=0, timeout=120)
        return client.messages.create(model=MODEL, max_tokens=16, messages=messages, extra_body={"temperature": 0})

    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (28, 28), (250, 10, 10)).save(buf, format="PNG")
    red, blue = image(buf.getvalue()), image(PNG)
    one, two = read(red), read(red, blue)
    assert two.usage.input_tokens - one.usage.input_tokens == IMAGE_TOKENS
    assert one.content[0].text != read(blue).content[0].text


@pytest.mark.parametrize("path, reason", [
    ("/big.png", "larger than"),
    ("/huge.png", "pixels"),
    ("/slow", "longer than"),
    ("/to-private", "non-public"),
    ("/text", "cannot decode"),
    ("/missing.png", "HTTP 404"),
])
def test_unsafe_or_broken_image_is_400(vision_server, site, path, reason):
    with pytest.raises(openai.BadRequestError) as err:
        _ask(vision_server, DATA_URL, f"{site}{path}")
    assert err.value.body["param"] == "messages.0.content.1"
    assert reason in err.value.body["message"]


def test_a_requests_images_are_bounded_in_number_and_in_pixels_in_all(vision_server, site):
    import io

    from PIL import Image

    before = len(REQUESTS)
    with pytest.raises(openai.BadRequestError) as err:  # refused before any is fetched
        _ask(vision_server, f"{site}/ok.png", f"{site}/ok.png", f"{site}/ok.png", f"{site}/slow")
    assert err.value.status_code == 400 and err.value.body["param"] == "messages.0.content.3"
    assert REQUESTS[before:] == []  # the image site (in this process) got no request
    assert "4 images, more than 3 per request (--max-images-per-request)" in err.value.body["message"]
    buf = io.BytesIO()
    Image.new("RGB", (1000, 1000), (0, 0, 0)).save(buf, format="PNG")  # 1 Mpx in a few KB: each one allowed
    big = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    with pytest.raises(openai.BadRequestError) as err:
        _ask(vision_server, big, big, big)
    assert err.value.body["param"] == "messages.0.content.2"
    assert "more than 2500000 pixels in all (--max-image-pixels-per-request)" in err.value.body["message"]
    assert _ask(vision_server, big, big).usage.prompt_tokens > 2 * IMAGE_TOKENS  # within both bounds
    assert httpx.get(f"{vision_server.url}/health").status_code == 200


def test_lone_surrogate_with_image_is_400(vision_server):
    body = json.dumps({"model": MODEL, "messages": _message(DATA_URL, text="hi \ud800")}, ensure_ascii=True)
    resp = httpx.post(f"{vision_server.url}/v1/chat/completions", content=body,
                      headers={"content-type": "application/json"}, timeout=60)
    assert resp.status_code == 400 and "surrogate" in resp.json()["error"]["message"]


@pytest.mark.parametrize("url, reason", [
    ("data:image/png;base64,not-base64!", "base64"),
    ("ftp://example.com/a.png", "http(s)"),
])
def test_bad_image_urls_are_400(vision_server, url, reason):
    with pytest.raises(openai.BadRequestError) as err:
        _ask(vision_server, url)
    assert reason in err.value.body["message"]


def test_loopback_refused_unless_allowed(llava, site, vision_server):
    strict = RemoteServer("--engine", "transformers", "--model", str(llava))
    try:
        with pytest.raises(openai.BadRequestError) as err:
            _ask(strict, f"{site}/ok.png")
        assert "non-public address" in err.value.body["message"]
        assert "--allowed-media-domains" in err.value.body["message"]
    finally:
        strict.stop()
    assert _ask(vision_server, f"{site}/ok.png").usage.prompt_tokens > IMAGE_TOKENS


@pytest.mark.skipif(importlib.util.find_spec("torchvision") is not None, reason="torchvision is installed")
def test_glm4v_processor_without_torchvision_is_a_one_line_error(tmp_path):
    """transformers builds GLM-4V's processor only with torchvision (its video half)."""
    from tests.unit.engine.test_glm4v_engine import _model_and_tokenizer

    model, tokenizer = _model_and_tokenizer()
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(
        {"image_processor_type": "Glm4vImageProcessor", "processor_class": "Glm4vProcessor"}))
    proc = subprocess.run([sys.executable, "-m", "glmserve", "serve", "--engine", "transformers", "--model",
                           str(tmp_path), "--port", "0"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Torchvision" in lines[0], proc.stderr
