"""PEFT LoRA adapter folders: their rank, and whether they fit the base model (vllm, and the
transformers engine before it loads an adapter at run time: PEFT changes the model's modules
before it finds that an adapter's tensors do not fit).

vLLM 0.32 loads an adapter whose tensors name modules the model does not have, or whose shapes
differ, without an error (checked here with an adapter for a smaller Llama). So glmserve checks
every adapter against the model's weights before vLLM starts: each ``lora_A`` ``[r, in]`` and
``lora_B`` ``[out, r]`` of PEFT's ``base_model.model.<module>.lora_{A,B}.weight`` must sit on a
``<module>.weight`` of shape ``[out, in]`` in the model's safetensors files. Only the tensor
headers are read (``safetensors.safe_open``), never the weights.
"""

from __future__ import annotations

import json
from pathlib import Path

from glmserve.engine.base import EngineError, LoRAAdapterError

# vLLM accepts only these LoRA ranks (vllm.config.lora.MaxLoRARanks)
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
_PREFIX = "base_model.model."


def lora_rank(folder: Path) -> int:
    """The rank ``r`` of a PEFT adapter folder (its ``adapter_config.json``). Raises
    ``EngineError`` when the folder is no PEFT adapter."""
    try:
        if not (folder / "adapter_config.json").is_file():  # not a FIFO or a device, which could block
            raise OSError("no adapter_config.json")
        config = json.loads((folder / "adapter_config.json").read_text())
        return int(config["r"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise EngineError(f"{folder} is not a PEFT adapter folder (no readable adapter_config.json with 'r')") from exc


def _shapes(files: list[Path]) -> dict[str, tuple[int, ...]]:
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        with safe_open(str(file), framework="numpy") as f:
            for key in f.keys():
                shapes[key] = tuple(f.get_slice(key).get_shape())
    return shapes


def check_adapter(name: str, adapter: Path, model: Path) -> None:
    """Raise ``LoRAAdapterError`` naming the first tensor of ``adapter`` that does not fit ``model``
    (a Hugging Face folder with safetensors weights; other models are not checked), or an
    ``adapter`` that is no PEFT adapter folder."""
    try:
        lora_rank(adapter)
    except EngineError as exc:
        raise LoRAAdapterError(f"LoRA adapter {name!r}: {exc}") from exc
    weights = sorted(model.glob("*.safetensors")) if model.is_dir() else []
    adapter_file = adapter / "adapter_model.safetensors"
    if not weights or not adapter_file.is_file():
        return
    base = _shapes(weights)
    for key, shape in _shapes([adapter_file]).items():
        module, _, part = key.removeprefix(_PREFIX).rpartition(".lora_")
        target = base.get(f"{module}.weight")
        if part not in ("A.weight", "B.weight"):
            continue
        fits = target is not None and len(shape) == 2 and len(target) == 2 and (
            shape[1] == target[1] if part == "A.weight" else shape[0] == target[0])
        if not fits:
            have = f"the model's {module}.weight is {list(target)}" if target else f"the model has no {module}"
            raise LoRAAdapterError(f"LoRA adapter {name!r} ({adapter}) does not match the base model: {key} is "
                              f"{list(shape)}, {have}")
