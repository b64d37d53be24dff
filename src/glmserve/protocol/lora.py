"""``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` bodies, in vLLM's shapes
(``vllm/entrypoints/openai/protocol.py``: ``LoadLoRAAdapterRequest``, ``UnloadLoRAAdapterRequest``)."""

from __future__ import annotations

from pydantic import Field

from glmserve.protocol.chat import _Lenient


class LoadLoRAAdapterRequest(_Lenient):
    """``lora_path``: on the server (a GGUF LoRA file on llama_cpp, a PEFT folder on
    transformers and vllm); ``load_inplace``: replace an adapter already loaded under the name;
    ``model`` (glmserve's): the base model, on a server of several (default: the default one)."""

    model: str | None = None
    lora_name: str = Field(min_length=1, max_length=256)
    lora_path: str = Field(min_length=1, max_length=4096)
    load_inplace: bool = False


class UnloadLoRAAdapterRequest(_Lenient):
    model: str | None = None
    lora_name: str = Field(min_length=1, max_length=256)
