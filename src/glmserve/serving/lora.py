"""LoRA adapters loaded and unloaded at run time (vLLM's ``/v1/load_lora_adapter`` and
``/v1/unload_lora_adapter``, answered as vLLM answers them): the checks that do not need the
engine, then the engine's ``load_lora_adapter`` / ``unload_lora_adapter``, one at a time."""

from __future__ import annotations

import asyncio

from glmserve.engine.base import EngineError
from glmserve.protocol.errors import APIError, invalid_request
from glmserve.protocol.lora import LoadLoRAAdapterRequest, UnloadLoRAAdapterRequest
from glmserve.serving.chat import ChatService

MAX_LORA_ADAPTERS = 64  # adapters loaded at once; each holds its weights in memory


class LoRAAdapterService:
    """Over the engine of ``chat``. Both methods return vLLM's success text and raise
    ``APIError``: 400 for a name taken (by the model or a loaded adapter, unless
    ``load_inplace``), more than ``MAX_LORA_ADAPTERS``, or an adapter the engine refuses
    (missing, does not fit the model, or an engine that cannot load it now); 404 for
    unloading a name that is not loaded."""

    def __init__(self, chat: ChatService) -> None:
        self.chat = chat
        self.engine = chat.engine
        self._lock = asyncio.Lock()

    async def load(self, req: LoadLoRAAdapterRequest) -> str:
        name = req.lora_name
        if name == self.chat.model_name:
            raise invalid_request(f"'{name}' is the base model's name", "lora_name")
        async with self._lock:
            replace = name in self.chat.adapters
            if replace and not req.load_inplace:
                raise invalid_request(f"The lora adapter '{name}' has already been loaded.", "lora_name")
            if not replace and len(self.chat.adapters) >= MAX_LORA_ADAPTERS:
                raise invalid_request(f"{MAX_LORA_ADAPTERS} LoRA adapters are loaded, the most this server holds; "
                                      "unload one first", "lora_name")
            # the engine's work goes on if the client leaves: an adapter is never left half loaded
            await asyncio.shield(self._load(name, req.lora_path, replace))
        return f"Success: LoRA adapter '{name}' added successfully."

    async def _load(self, name: str, path: str, replace: bool) -> None:
        if replace:
            await self.engine.unload_lora_adapter(name)
        try:
            await self.engine.load_lora_adapter(name, path)
        except EngineError as exc:  # LoRAAdapterError, or an engine that cannot load adapters
            raise invalid_request(str(exc), "lora_path") from exc

    async def unload(self, req: UnloadLoRAAdapterRequest) -> str:
        name = req.lora_name
        async with self._lock:
            if name not in self.chat.adapters:
                raise APIError(404, f"The lora adapter '{name}' cannot be found.", "invalid_request_error",
                               "lora_name", "lora_adapter_not_found")
            await asyncio.shield(self.engine.unload_lora_adapter(name))
        return f"Success: LoRA adapter '{name}' removed successfully."
