"""The models one app serves, as the routes see them: a request's ``model`` (a model's name, an
alias, or a LoRA adapter of a model) to a lease on that model's ``LoadedModel`` (and, for an adapter
and a route that generates, a lease on the adapter: ``serving/adapters.py``), with the
registry's errors as API errors; and the ``/v1/models`` cards.

One model (``glmserve serve --model``) is a registry of one, loaded at start and kept.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from glmserve.protocol.errors import APIError, invalid_request, model_not_found
from glmserve.protocol.models import ModelCard, model_capabilities
from glmserve.serving.adapters import AdapterTable
from glmserve.runtime.registry import (
    Lease,
    ModelLoadError,
    ModelRegistry,
    ModelSpec,
    RegistryFull,
    UnknownModel,
)

if TYPE_CHECKING:
    from glmserve.runtime.loaded import LoadedModel

RETRY_AFTER_S = 5  # a model that does not fit now: when to try again


def registry_error(exc: Exception) -> APIError:
    """The API error for a registry error: 404 for an unknown model, 500 naming the model and the
    cause for a failed load (``model_load_failed``), 503 with ``Retry-After`` when it does not
    fit beside the busy models."""
    if isinstance(exc, UnknownModel):
        return model_not_found(exc.model)
    if isinstance(exc, RegistryFull):
        return APIError(503, str(exc), "server_error", "model", "model_busy",
                        headers={"Retry-After": str(RETRY_AFTER_S)})
    if isinstance(exc, ModelLoadError):
        return APIError(500, str(exc), "server_error", "model", "model_load_failed")
    raise exc


class ModelRouter:
    """Over ``registry`` (of ``LoadedModel``\\ s); ``default``: the model a request without ``model``
    gets (``/tokenize``); ``adapters``: each model's LoRA adapters (the table each load is
    started with, which outlives them; a model without one has the adapters of its loaded model)."""

    def __init__(self, registry: ModelRegistry[LoadedModel], default: str,
                 adapters: dict[str, AdapterTable] | None = None) -> None:
        self.registry = registry
        self.default = default
        self.adapters = dict(adapters or {})
        self._created: dict[str, int] = {}

    @classmethod
    def single(cls, loaded: LoadedModel) -> ModelRouter:
        """One model, started already, kept loaded."""
        name = loaded.pipeline.name
        registry: ModelRegistry[LoadedModel] = ModelRegistry(
            [ModelSpec(name, load=lambda: loaded, unload=lambda r: r.shutdown(), pinned=True)])
        registry.adopt(name, loaded)
        return cls(registry, name, {name: loaded.pipeline.adapter_table})

    def _tables(self) -> dict[str, AdapterTable]:
        return {**{name: loaded.pipeline.adapter_table for name, loaded in self.registry.loaded_models().items()},
                **self.adapters}

    def _model_of(self, model: str) -> tuple[str, bool]:
        """The registry name serving ``model``, and whether ``model`` is a LoRA adapter of it."""
        try:
            return self.registry.resolve(model), False
        except UnknownModel:
            for name, table in self._tables().items():
                if model in table.names:
                    return name, True
            raise

    def _embeddings_only(self, name: str, loaded: LoadedModel | None = None) -> bool:
        """Whether model ``name`` is served for embeddings only: so configured (a ``--config``
        entry's ``embedding``), or, once ``loaded``, its engine does not generate."""
        return bool(self.registry.metadata(name).get("embedding_only")) or (
            loaded is not None and not loaded.engine.model_info.generation)

    async def acquire(self, model: str | None, keep_alive: float | None = None,
                      generation: bool = False) -> Lease[LoadedModel]:
        """A lease on the loaded model serving ``model`` (None: the default model), loading it if
        needed; ``generation``: for a route that generates text, which a model served for
        embeddings only refuses (400, before loading it). Raises ``APIError``
        (``registry_error``)."""
        try:
            name, adapter = self._model_of(model or self.default)
            if generation and self._embeddings_only(name):  # before loading it
                raise _not_generating(name)
            lease = await self.registry.acquire(name, keep_alive)
        except (UnknownModel, ModelLoadError, RegistryFull) as exc:
            raise registry_error(exc) from exc
        if generation and self._embeddings_only(name, lease.loaded):  # a pooling model found so on loading
            lease.release()
            raise _not_generating(name)
        if adapter and generation:
            try:  # the adapter is loaded, and stays, until the lease is released
                lease.also_release(await lease.loaded.pipeline.adapter_table.acquire(model))
            except BaseException:
                lease.release()
                raise
        return lease

    def loaded_models(self) -> dict[str, LoadedModel]:
        return self.registry.loaded_models()

    def names(self) -> set[str]:
        """Every name a request's ``model`` may give here: the models, their aliases and their
        LoRA adapters (loaded or not)."""
        names = set(self.registry.names())
        for table in self._tables().values():
            names.update(table.names)
        return names

    def cards(self) -> list[ModelCard]:
        """Every model (with ``status``), each loaded one followed by its LoRA adapters."""
        cards = []
        loaded_models = self.registry.loaded_models()
        for item in self.registry.status():
            name = item["model"]
            loaded = loaded_models.get(name)
            engine = item["metadata"].get("engine")
            if loaded is None:
                cards.append(ModelCard(id=name, created=self._created_at(name), owned_by="glmserve",
                                       status=item["status"], engine=engine))
                continue
            info, model = loaded.engine.model_info, loaded.pipeline
            capabilities = (["embedding"] if self._embeddings_only(name, loaded) else
                            model_capabilities(info.vision, model.tool_parser, info.embedding_size is not None))
            for card_name in (model.name, *model.adapters):
                cards.append(ModelCard(
                    id=card_name, created=self._created_at(card_name), owned_by=info.owned_by,
                    max_model_len=info.context_length, root=info.id,
                    parent=None if card_name == model.name else model.name,
                    tool_call_parser=model.tool_parser, max_num_seqs=info.max_num_seqs,
                    max_num_batched_tokens=info.max_num_batched_tokens, max_queue=info.max_queue,
                    capabilities=capabilities, status=item["status"], engine=engine, backend=info.backend,
                    n_gpu_layers=info.n_gpu_layers, devices=list(info.devices) if info.devices else None))
        return cards

    def _created_at(self, name: str) -> int:
        return self._created.setdefault(name, int(time.time()))

    async def close(self) -> None:
        await self.registry.close()


def _not_generating(name: str) -> APIError:
    return invalid_request(f"model '{name}' is served for embeddings only (POST /v1/embeddings)", "model",
                           "model_not_supported")
