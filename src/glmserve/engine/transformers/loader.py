"""Load a Hugging Face model for serving: weights, tokenizer, processor (vision) and LoRA adapters.

- Text models through ``AutoModelForCausalLM`` (``GlmForCausalLM``, ``Glm4ForCausalLM``, Llama...);
  models whose config has a ``vision_config`` through ``AutoProcessor`` +
  ``AutoModelForImageTextToText`` (``Glm4vForConditionalGeneration``, LLaVA...). Remote-code
  checkpoints load with ``trust_remote_code``.
- A ``.gguf`` file through transformers' ``gguf_file=`` loader (dequantized to ``dtype``).
- ``local_files_only`` always: nothing is downloaded.
- LoRA adapters with PEFT, each under its own name; an adapter that does not fit the base model
  (target modules missing, shapes that differ) is an ``EngineError``.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText, AutoProcessor, AutoTokenizer

from glmserve.engine.base import EngineError, LoRAAdapterError, one_line
from glmserve.models import ResolvedModel

log = logging.getLogger("glmserve.engine.transformers")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(slots=True)
class LoadedCheckpoint:
    model: Any  # a PreTrainedModel, or a PeftModel around one when adapters are loaded
    tokenizer: Any
    processor: Any | None  # AutoProcessor of a vision model
    device: torch.device
    context_length: int
    chat_template: str | None
    eos_ids: tuple[int, ...]
    adapters: tuple[str, ...] = field(default_factory=tuple)


def pick_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise EngineError("--device cuda: no CUDA device is available to torch")
    return torch.device(device)


def pick_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``auto``: bfloat16 on a GPU that supports it, else float16 on GPU, float32 on CPU."""
    if dtype != "auto":
        return DTYPES[dtype]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


def _context_length(config: Any, tokenizer: Any) -> int:
    text = getattr(config, "text_config", None) or config
    for name in ("max_position_embeddings", "seq_length", "n_positions", "max_sequence_length"):
        value = getattr(text, name, None)
        if isinstance(value, int) and value > 0:
            return value
    limit = getattr(tokenizer, "model_max_length", 0)
    return limit if 0 < limit < 1 << 24 else 4096


def _eos_ids(model: Any) -> tuple[int, ...]:
    config = getattr(model, "generation_config", None)
    eos = getattr(config, "eos_token_id", None) if config is not None else None
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, (list, tuple)) else (eos,)


def load_model(resolved: ResolvedModel, dtype: str, device: str, trust_remote_code: bool,
               lora: dict[str, Path] | None = None) -> LoadedCheckpoint:
    """Load ``resolved`` (see module docstring). Raises ``EngineError`` with a one-line reason."""
    dev = pick_device(device)
    torch_dtype = pick_dtype(dtype, dev)
    common: dict[str, Any] = {"local_files_only": True, "trust_remote_code": trust_remote_code}
    if resolved.format == "gguf":
        folder, common["gguf_file"] = resolved.path.parent, resolved.path.name
    else:
        folder = resolved.path
    processor = None
    try:
        config = AutoConfig.from_pretrained(folder, **common)
        vision = getattr(config, "vision_config", None) is not None
        if vision:
            try:
                processor = AutoProcessor.from_pretrained(folder, **common)
            except AttributeError as exc:  # transformers' processor registry without torchvision
                raise ImportError(f"cannot build the model's processor ({exc}); processors with a video "
                                  "half, GLM-4V's included, need torchvision") from exc
            if getattr(processor, "image_processor", None) is None:
                # remote-code checkpoints such as THUDM/glm-4v-9b ship a tokenizer, not a processor
                log.warning("%s has no transformers image processor: serving it without image input",
                            resolved.path)
                processor, vision = None, False
        tokenizer = processor.tokenizer if processor is not None else AutoTokenizer.from_pretrained(folder, **common)
        model_cls = AutoModelForImageTextToText if vision else AutoModelForCausalLM
        try:
            model = model_cls.from_pretrained(folder, dtype=torch_dtype, **common)
        except ValueError:
            if model_cls is AutoModelForCausalLM or not trust_remote_code:
                raise
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch_dtype, **common)
    except (OSError, ValueError, KeyError, RuntimeError, ImportError) as exc:
        raise EngineError(f"cannot load {resolved.path} with transformers {transformers.__version__}: "
                          f"{one_line(exc)}") from exc
    model.to(dev).eval()
    template = getattr(processor, "chat_template", None) or getattr(tokenizer, "chat_template", None)
    loaded = LoadedCheckpoint(model, tokenizer, processor, dev, _context_length(config, tokenizer), template,
                         _eos_ids(model))
    if lora:
        loaded.model = load_adapters(model, lora)
        loaded.adapters = tuple(lora)
    return loaded


def load_adapters(model: Any, adapters: dict[str, Path]) -> Any:
    """``model`` wrapped in a ``PeftModel`` holding every adapter under its name. Raises
    ``EngineError`` when PEFT is missing, ``LoRAAdapterError`` when an adapter does not match
    the base model."""
    for name, path in adapters.items():
        model = add_adapter(model, name, path)
    return model


def add_adapter(model: Any, name: str, path: str | Path) -> Any:
    """``model`` (a ``PreTrainedModel`` or a ``PeftModel``) with the PEFT adapter folder ``path``
    added as ``name``: the ``PeftModel`` to run from now on. Raises ``EngineError`` when PEFT
    is missing, ``LoRAAdapterError`` when the folder is no PEFT adapter or does not fit."""
    try:
        from peft import PeftModel
    except ImportError as exc:
        raise EngineError("LoRA adapters need PEFT (pip install '.[transformers]')") from exc
    if not (Path(path) / "adapter_config.json").is_file():
        raise LoRAAdapterError(f"LoRA adapter {name!r}: {path} is not a PEFT adapter folder (no adapter_config.json)")
    try:
        with warnings.catch_warnings():  # PEFT still calls names transformers deprecated
            warnings.simplefilter("ignore", FutureWarning)
            if isinstance(model, PeftModel):
                model.load_adapter(str(path), adapter_name=name, is_trainable=False)
            else:
                model = PeftModel.from_pretrained(model, str(path), adapter_name=name, is_trainable=False)
    except (ValueError, RuntimeError, KeyError, OSError, TypeError) as exc:
        if isinstance(model, PeftModel) and name in model.peft_config:  # half loaded: take it out again
            model.delete_adapter(name)
        raise LoRAAdapterError(f"LoRA adapter {name!r} ({path}) does not match the base model: "
                               f"{one_line(exc, 300)}") from exc
    log.info("LoRA adapter %s loaded from %s", name, path)
    return model.eval()


def remove_adapter(model: Any, name: str) -> Any:
    """``model`` (a ``PeftModel``) without the adapter ``name``: the model to run from now on
    (the base model again, its LoRA layers removed, when it was the last one)."""
    if len(model.peft_config) <= 1:
        return model.unload()
    model.delete_adapter(name)
    return model
