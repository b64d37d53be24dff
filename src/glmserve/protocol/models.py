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


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
