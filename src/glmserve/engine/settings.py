"""``EngineSettings``: the settings of one model that every engine reads (which model, on which
engine, its context, its batch and queue, its LoRA adapters). Each engine's settings class
(``engine/<name>/settings.py``) extends it with its own flags, and ``build`` takes that class;
the server's ``ModelSettings`` (``glmserve.settings.model``) extends all three.

A field marked ``PER_MODEL`` belongs to one model alone: in a server of several models it is
``--model``'s own and each ``--config`` entry gives its own (a LoRA adapter, a draft model, a
projector or a chat template made for one model does not fit another). Every other model field
is a default each model inherits unless its entry says otherwise.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal, TypeVar

from pydantic import BaseModel, Field, field_validator, model_validator

S = TypeVar("S", bound=BaseModel)
# json_schema_extra of a field that is one model's own, never inherited by another model
PER_MODEL = {"per_model": True}
_ADAPTER_NAME = re.compile(r"^[A-Za-z0-9_.\-/:]{1,128}$")


def per_model_fields(cls: type[BaseModel]) -> frozenset[str]:
    """The fields of ``cls`` marked ``PER_MODEL``."""
    return frozenset(name for name, field in cls.model_fields.items()
                     if isinstance(field.json_schema_extra, dict) and field.json_schema_extra.get("per_model"))


def narrowed(settings: BaseModel, cls: type[S]) -> S:
    """``settings`` as a ``cls`` (one of its bases): ``cls``' fields with their values, and which
    of them were given (``model_fields_set``: a flag's default stays told apart from a value
    given), nothing else. Not validated again: ``settings`` was. ``settings`` itself when it is a
    ``cls`` already. How a per-model start sees only ``ModelSettings`` of the server's settings
    and an engine only its own settings class."""
    if type(settings) is cls:
        return settings
    names = cls.model_fields.keys()
    return cls.model_construct(_fields_set=settings.model_fields_set & names,
                               **{name: getattr(settings, name) for name in names})


def own_fields(cls: type[BaseModel]) -> frozenset[str]:
    """The fields an engine's settings class adds to ``EngineSettings``: the engine's flags."""
    return frozenset(cls.model_fields) - frozenset(EngineSettings.model_fields)


class EngineSettings(BaseModel):
    """What is served: which model on which engine, its context, and how many requests it runs
    and queues."""

    model: str | None = Field(
        None,
        description="A .gguf file or its folder, or a Hub name fetched into the HF cache (ORG/NAME-GGUF:QUANT; "
                    "transformers, vllm: ORG/NAME, a folder).", json_schema_extra=PER_MODEL,
    )
    engine: Literal["llama_cpp", "transformers", "vllm"] = Field(
        "llama_cpp", description="Inference engine: llama_cpp (GGUF on CPU, CUDA, Metal or Vulkan), transformers (Hugging Face models, "
                                 "CPU or GPU) or vllm (vLLM, GPUs).",
    )
    n_ctx: int = Field(
        4096, ge=0, le=1 << 20,
        description="Context window in tokens, prompt plus output (0: the model's training context); vllm: "
                    "max_model_len, the model's own unless given.",
    )
    max_num_seqs: int | None = Field(
        None, ge=1, le=4096, description="Sequences decoded together in one batch (running requests); /v1/models "
                                         "shows the value in force.",
    )
    max_queue: int | None = Field(
        None, ge=0, le=1 << 20,
        description="Requests that may wait for a free sequence; beyond that the server answers 429 with "
                    "Retry-After.",
    )
    lora: list[str] = Field(
        [], description="A LoRA adapter that requests pick with model NAME (repeatable): a GGUF LoRA file "
                        "(llama_cpp) or a PEFT folder.", json_schema_extra=PER_MODEL,
    )
    max_loras: int = Field(
        8, ge=1, le=64, description="LoRA adapters held in memory per model; the least recently used idle one is "
                                    "unloaded to load another.",
    )

    @field_validator("lora")
    @classmethod
    def _check_lora(cls, value: list[str]) -> list[str]:
        names = set()
        for item in value:
            name, eq, path = item.partition("=")
            if not eq or not _ADAPTER_NAME.match(name) or not path:
                raise ValueError(f"{item!r}: expected NAME=PATH (NAME: letters, digits, '_', '-', '.', '/')")
            if name in names:
                raise ValueError(f"LoRA adapter name {name!r} given twice")
            names.add(name)
        return value

    @model_validator(mode="after")
    def _check_max_loras(self):
        if len(self.lora) > self.max_loras:
            raise ValueError(f"--lora gives {len(self.lora)} adapters, more than --max-loras {self.max_loras} "
                             "holds at once: raise --max-loras")
        return self

    def lora_adapters(self) -> dict[str, Path]:
        """``--lora`` as {adapter name: path}, in the order given."""
        return {name: Path(path).expanduser() for name, _, path in (item.partition("=") for item in self.lora)}
