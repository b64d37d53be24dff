"""OpenAI ``/v1/models`` wire types."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    # extensions (vLLM's names): context window in tokens, base model of an adapter
    max_model_len: int | None = None
    parent: str | None = None
    root: str | None = None
    tool_call_parser: str | None = None
    # extensions (vLLM's flag names): the batch and admission limits in force
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    max_queue: int | None = None
    # extension (Ollama's name and values): what the model can be sent; the web page shows its
    # image button for "vision"
    capabilities: list[Literal["completion", "tools", "vision", "embedding"]] = ["completion"]
    # extensions for a server of many models (llama-server's router mode): whether it is loaded
    # now, and the engine that serves it
    status: Literal["loaded", "loading", "unloaded"] | None = None
    engine: str | None = None
    # extensions (llama.cpp's names): the backend the model runs on (CPU, CUDA, Metal, Vulkan...)
    # and the layers offloaded to its GPUs (0 on the CPU); the devices llama.cpp has (NAME
    # (description, free of total MiB free), the --rpc servers' among them)
    backend: str | None = None
    n_gpu_layers: int | None = None
    devices: list[str] | None = None


def model_capabilities(vision: bool, tool_call_parser: str | None, embedding: bool = False) -> list[str]:
    """A model card's ``capabilities``: always ``completion``; ``tools`` with a tool-call
    format; ``vision`` when the engine takes images; ``embedding`` when it serves
    ``/v1/embeddings``."""
    return ["completion", *(["tools"] if tool_call_parser else []), *(["vision"] if vision else []),
            *(["embedding"] if embedding else [])]


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
