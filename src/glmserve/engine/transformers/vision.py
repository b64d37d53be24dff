"""Image input for Hugging Face vision-language models, through the model's own ``AutoProcessor``.

The processor expands each image placeholder the chat template wrote into the model's image
tokens (so the prompt's token count, and usage, include them) and turns the images into the
tensors the model's forward takes (``pixel_values``, ``image_grid_thw``, ...), which ride along
with the request to its prefill.
"""

from __future__ import annotations

from typing import Any

import torch


class ProcessorError(ValueError):
    """The processor refused the prompt or the images (a 400 for the client)."""


class ImageProcessor:
    """``process(text, images)`` -> ``(token_ids, model_inputs)``; thread-safe for concurrent
    calls (processors are stateless after load)."""

    def __init__(self, processor: Any, dtype: torch.dtype) -> None:
        self._processor = processor
        self._dtype = dtype

    def process(self, text: str, images: list[Any]) -> tuple[list[int], dict[str, torch.Tensor]]:
        """Token ids of ``text`` (special-token markup parsed, nothing added: the chat template
        writes BOS where the model wants one) with image tokens expanded, and the extra model
        inputs. Raises ``ProcessorError``."""
        try:
            out = self._processor(text=[text], images=images, return_tensors="pt", add_special_tokens=False)
        except (ValueError, TypeError, IndexError, RuntimeError) as exc:
            text.encode("utf-8")  # a lone surrogate: UnicodeEncodeError, as from the tokenizer
            raise ProcessorError(f"the model's processor rejected the images: {exc}") from exc
        ids = out["input_ids"][0].tolist()
        extra = {}
        for key, value in out.items():
            if key in ("input_ids", "attention_mask") or not isinstance(value, torch.Tensor):
                continue
            extra[key] = value.to(self._dtype) if value.is_floating_point() else value
        return ids, extra
