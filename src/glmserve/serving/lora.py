"""LoRA adapters loaded and unloaded at run time (vLLM's ``/v1/load_lora_adapter`` and
``/v1/unload_lora_adapter``, answered as vLLM answers them): the checks that do not need the
engine, then the model's ``AdapterTable`` (``serving/adapters.py``), which loads into the engine
and unloads once the adapter's last request ended."""

from __future__ import annotations

import asyncio

from glmserve.protocol.errors import APIError, invalid_request
from glmserve.protocol.lora import LoadLoRAAdapterRequest, UnloadLoRAAdapterRequest
from glmserve.serving.generation.pipeline import ModelPipeline


class LoRAAdapterService:
    """Over the adapters of ``chat``. Both methods return vLLM's success text and raise
    ``APIError``: 400 for a name taken (by the model or a loaded adapter, unless
    ``load_inplace``), more than ``adapters.MAX_LORA_ADAPTERS``, or an adapter the engine refuses
    (missing, does not fit the model, or an engine that cannot load it now); 404 for
    unloading a name that is not loaded."""

    def __init__(self, pipeline: ModelPipeline) -> None:
        self.pipeline = pipeline
        self._lock = asyncio.Lock()  # one load or unload request at a time

    async def load(self, req: LoadLoRAAdapterRequest) -> str:
        name = req.lora_name
        if name == self.pipeline.name or name in self.pipeline.aliases:
            raise invalid_request(f"'{name}' is the base model's name", "lora_name")
        async with self._lock:
            replace = name in self.pipeline.adapters
            if replace and not req.load_inplace:
                raise invalid_request(f"The lora adapter '{name}' has already been loaded.", "lora_name")
            # the work goes on if the client leaves: an adapter is never left half loaded
            await asyncio.shield(self.pipeline.adapter_table.register(name, req.lora_path, replace))
        return f"Success: LoRA adapter '{name}' added successfully."

    async def unload(self, req: UnloadLoRAAdapterRequest) -> str:
        name = req.lora_name
        async with self._lock:
            if name not in self.pipeline.adapters:
                raise APIError(404, f"The lora adapter '{name}' cannot be found.", "invalid_request_error",
                               "lora_name", "lora_adapter_not_found")
            await asyncio.shield(self.pipeline.adapter_table.unload(name))
        return f"Success: LoRA adapter '{name}' removed successfully."
