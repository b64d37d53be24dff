"""GLM-4V's multimodal RoPE in the transformers engine: an image request batched with a text
request decodes exactly what ``Glm4vForConditionalGeneration.generate`` produces for each alone.

The model is tiny and random, built from a config. Its ``Glm4vProcessor`` cannot be built here
(transformers requires torchvision for the video half, and no CPU torchvision exists for this
machine), so the test makes the processor's output itself: ``Glm4vImageProcessorPil`` for the
pixels, the ``<|image|>`` placeholder repeated once per merged patch, and ``mm_token_type_ids``.
Large initial weights and a small RoPE base make the output depend on positions: with the
image's ``rope_deltas`` left out of the decode positions, the test fails."""

from __future__ import annotations

import asyncio

import pytest

torch = pytest.importorskip("torch")

from PIL import Image  # noqa: E402

from glmserve.engine.transformers.engine import TransformersEngine  # noqa: E402
from glmserve.engine.transformers.settings import TransformersSettings  # noqa: E402
from glmserve.engine.transformers.loader import LoadedCheckpoint  # noqa: E402
from glmserve.engine.types import GenerationRequest, SamplingParams  # noqa: E402
from glmserve.models import ResolvedModel  # noqa: E402
from tests.unit.glm_tokenizer import glm_tokenizer  # noqa: E402

MAX_TOKENS = 10


def _model_and_tokenizer():
    from transformers import Glm4vConfig, Glm4vForConditionalGeneration

    tok = glm_tokenizer("")
    tok.add_tokens(["<|image|>", "<|video|>"], special_tokens=True)
    ids = tok.convert_tokens_to_ids
    config = Glm4vConfig(
        text_config=dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024, initializer_range=0.5,
                         rope_parameters={"rope_type": "default", "rope_theta": 100.0, "mrope_section": [1, 1, 2],
                                          "partial_rotary_factor": 0.5}),
        vision_config=dict(hidden_size=32, depth=2, num_heads=2, intermediate_size=64, out_hidden_size=64,
                           patch_size=14, spatial_merge_size=2, temporal_patch_size=2, image_size=336),
        image_token_id=ids("<|image|>"), video_token_id=ids("<|video|>"),
        image_start_token_id=ids("<|begin_of_image|>"), image_end_token_id=ids("<|end_of_image|>"),
        video_start_token_id=ids("<|begin_of_video|>"), video_end_token_id=ids("<|end_of_video|>"))
    torch.manual_seed(0)
    return Glm4vForConditionalGeneration(config).eval(), tok


def _image_inputs(tok) -> tuple[list[int], dict]:
    from transformers.models.glm4v.image_processing_pil_glm4v import Glm4vImageProcessorPil

    processor = Glm4vImageProcessorPil(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 64)
    image = Image.new("RGB", (224, 224), (200, 30, 30))
    pixels = processor(images=[image], return_tensors="pt")
    n_image = int(pixels["image_grid_thw"][0].prod()) // processor.merge_size ** 2
    text = "[gMASK]<sop><|user|>\n<|begin_of_image|>" + "<|image|>" * n_image + "<|end_of_image|>What is it?<|assistant|>\n"
    ids = tok.encode(text, add_special_tokens=False)
    image_id = tok.convert_tokens_to_ids("<|image|>")
    types = torch.tensor([[1 if i == image_id else 0 for i in ids]])
    return ids, {"pixel_values": pixels["pixel_values"], "image_grid_thw": pixels["image_grid_thw"],
                 "mm_token_type_ids": types}


def _reference(model, ids: list[int], extra: dict) -> list[int]:
    input_ids = torch.tensor([ids])
    out = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=MAX_TOKENS,
                         min_new_tokens=MAX_TOKENS, do_sample=False, **extra)
    model.model.rope_deltas = None
    return out[0, len(ids):].tolist()


def test_image_and_text_requests_batched_equal_generate_alone():
    model, tok = _model_and_tokenizer()
    image_ids, extra = _image_inputs(tok)
    text_ids = tok.encode("[gMASK]<sop><|user|>\nHello there, how are you?<|assistant|>\n", add_special_tokens=False)
    with torch.no_grad():
        expected = [_reference(model, image_ids, extra), _reference(model, text_ids, {})]

    loaded = LoadedCheckpoint(model, tok, None, torch.device("cpu"), 1024, None, ())
    engine = TransformersEngine(ResolvedModel(__import__("pathlib").Path("."), "tiny-glm4v", "hf"),
                                TransformersSettings(engine="transformers", n_threads=2), loaded=loaded)
    engine.start()
    try:
        async def run(request_id: str, ids: list[int], multimodal) -> list[int]:
            sampling = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
            tokens = []
            async for out in engine.generate(GenerationRequest(request_id, ids, sampling, multimodal=multimodal)):
                assert out.finish_reason != "error", out.error
                tokens += out.token_ids
            return tokens

        async def both():
            return await asyncio.gather(run("image", image_ids, extra), run("text", text_ids, None))

        assert asyncio.run(both()) == expected
    finally:
        engine.shutdown()
