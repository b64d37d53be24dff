"""``engine/llama_cpp/vision.py`` without a model: which projector GGUF is used, and the
refusals that come before libmtmd loads one."""

from __future__ import annotations

import pytest

pytest.importorskip("llama_cpp")

from glmserve.engine.base import EngineError  # noqa: E402
from glmserve.engine.llama_cpp.settings import LlamaCppSettings  # noqa: E402
from glmserve.engine.llama_cpp.vision import _split, find_mmproj, load_projector  # noqa: E402


def test_the_projector_beside_the_model_is_found(tmp_path):
    model = tmp_path / "GLM-4.6V-Flash-Q4_K_M.gguf"
    assert find_mmproj(None, model) is None
    (tmp_path / "mmproj-F16.gguf").write_bytes(b"")
    assert find_mmproj(None, model) == tmp_path / "mmproj-F16.gguf"
    assert find_mmproj("none", model) is None
    (tmp_path / "mmproj-BF16.gguf").write_bytes(b"")
    with pytest.raises(EngineError, match="2 projectors beside GLM-4.6V-Flash-Q4_K_M.gguf"):
        find_mmproj(None, model)
    assert find_mmproj(str(tmp_path / "mmproj-BF16.gguf"), model) == tmp_path / "mmproj-BF16.gguf"
    with pytest.raises(EngineError, match="no such file"):
        find_mmproj(str(tmp_path / "nope.gguf"), model)


def test_mtp_with_a_projector_is_refused_before_it_loads(tmp_path):
    (tmp_path / "mmproj-F16.gguf").write_bytes(b"")
    with pytest.raises(EngineError, match="--speculative mtp does not take image input yet"):
        load_projector(None, LlamaCppSettings(), tmp_path / "model.gguf", mtp=True)
    assert load_projector(None, LlamaCppSettings(mmproj="none"), tmp_path / "model.gguf", mtp=True) is None


def test_the_prompt_is_cut_at_glm4v_image_placeholders():
    image = "<|begin_of_image|><|image|><|end_of_image|>"
    assert _split(f"<|user|>\nA{image}B{image}\n<|assistant|>") == ["<|user|>\nA", "B", "\n<|assistant|>"]
    assert _split("<|user|>\n<|image|> as text") == ["<|user|>\n<|image|> as text"]


def test_a_prompt_with_an_images_media_tokens_decodes_without_them():
    """A vision prompt's ids hold each image's media tokens (``media_token``: negative ids, no
    vocabulary's); the tokenizer's decode (the miss report decodes whole prompts) gives the
    text around them, where llama.cpp read out of bounds and the server crashed."""
    import llama_cpp

    from glmserve.engine.llama_cpp.tokenizer import LlamaCppTokenizer
    from glmserve.engine.llama_cpp.vision import media_token
    from glmserve.models import default_model_path

    model = llama_cpp.Llama(str(default_model_path()), vocab_only=True, verbose=False)
    tokenizer = LlamaCppTokenizer(model._model)
    before, after = tokenizer.encode("A picture:"), tokenizer.encode(" is a cat.")
    image = [media_token(b"8,6,pixels")] * 3
    assert tokenizer.decode([*before, *image, *after, -1]) == "A picture: is a cat."
