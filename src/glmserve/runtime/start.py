"""Start a model from settings: engine (started), chat template, and the services over it (a
``runtime.loaded.LoadedModel``: ``start_model``); the models of a server of several
(``serve_many``: a ``runtime.router.ModelRouter`` over a ``ModelRegistry``), each with the
settings it is served with (``model_settings``).

Shared by ``glmserve serve``, every Ray Serve replica (through ``glmserve.composition``) and
the in-process ``LLM``, so all behave the same. Nothing here imports the HTTP server.
"""

from __future__ import annotations

import gc
import logging
import math
from pathlib import Path

from pydantic import ValidationError

from glmserve.chat import CHATML_TEMPLATE, ChatTemplate, ChatTemplateError
from glmserve.engine import (
    ENGINES,
    Engine,
    EngineError,
    check_engine_settings,
    create_engine,
    engine_settings,
    memory_estimate,
)
from glmserve.engine.settings import narrowed
from glmserve.models import ModelNotFoundError, hub
from glmserve.models.keep_alive import parse_keep_alive
from glmserve.runtime.catalog import OWN_FIELDS, SERVER_WIDE, ConfigError, ModelEntry, read_config, scan_models_dir
from glmserve.runtime.registry import ModelRegistry, ModelSpec
from glmserve.runtime.router import ModelRouter
from glmserve.runtime.loaded import LoadedModel
from glmserve.serving.adapters import AdapterTable
from glmserve.serving.generation.pipeline import ModelPipeline
from glmserve.serving.responses.sealed_reasoning import ReasoningSeal
from glmserve.settings.model import ModelSettings
from glmserve.settings.serve import ServeSettings
from glmserve.state import DatabaseError
from glmserve.toolcalls import detect_parser

log = logging.getLogger("glmserve.runtime.start")

STARTUP_ERRORS = (EngineError, ModelNotFoundError, ChatTemplateError, OSError, ConfigError, DatabaseError)


def load_chat_template(settings: ModelSettings, engine: Engine) -> ChatTemplate:
    """``--chat-template`` file, else the model's own template, else ChatML.

    Raises ``ChatTemplateError`` (does not compile) or ``OSError`` (file unreadable)."""
    info = engine.model_info
    if settings.chat_template:
        source = Path(settings.chat_template).read_text(encoding="utf-8")
    else:
        source = info.chat_template or CHATML_TEMPLATE
    return ChatTemplate(source, bos_token=info.bos_token, eos_token=info.eos_token)


def start_model(settings: ModelSettings, aliases: tuple[str, ...] = (),
                adapters: AdapterTable | None = None, seal: ReasoningSeal | None = None) -> LoadedModel:
    """Build and start the engine and the services over it, from ``settings`` (a
    ``ModelSettings``; of a ``ServeSettings`` only its ``ModelSettings`` part is read, and the
    engine gets only its own settings class: ``engine.for_engine``); ``aliases``: other names
    requests may give the model; ``adapters``: the model's LoRA adapter table, kept from an
    earlier load (its run-time adapters are loaded again at their first request; default: a new
    one); ``seal``: the key of ``/v1/responses``' ``encrypted_content`` (the server's, one for
    all its models; None: a request asking for it gets a 400).

    Raises one of ``STARTUP_ERRORS`` with a one-line message when the model cannot be found or
    loaded; the engine is shut down again if a later step fails."""
    settings = fetched(narrowed(settings, ModelSettings))
    engine = create_engine(settings)
    engine.start()
    try:
        template = load_chat_template(settings, engine)
        name = settings.served_model_name or engine.model_info.id
        parser = {"auto": detect_parser(template.source), "none": None}.get(
            settings.tool_call_parser, settings.tool_call_parser)
        table = adapters or AdapterTable(settings.max_loras)
        table.attach(engine, settings.lora_adapters())
        try:
            model = ModelPipeline.from_settings(engine, settings, name, template, parser, aliases, table)
        except ValueError as exc:  # a flag this model cannot use (--reasoning-budget without <think>)
            raise ConfigError(str(exc)) from exc
        return LoadedModel.over(model, settings.max_embedding_inputs, settings.max_embedding_tokens,
                                seal)
    except BaseException:
        engine.shutdown()
        raise


def fetched(settings: ModelSettings) -> ModelSettings:
    """``settings`` with a ``--model`` that names a Hugging Face Hub repository (``models/hub.py``)
    replaced by its local copy, fetched into the Hugging Face cache unless it is there (with a
    GGUF's vision projector, as ``--mmproj`` unless that is given), and served under the
    repository's name unless ``--served-model-name`` gives one. Raises ``ModelNotFoundError``."""
    found = hub.fetch(settings.model, settings.engine, settings.offline, settings.revision)
    if found is None:
        return settings
    update = {"model": str(found.path), "served_model_name": settings.served_model_name or found.repo}
    if found.mmproj is not None and getattr(settings, "mmproj", None) is None:  # the vision projector beside it
        update["mmproj"] = str(found.mmproj)
    return settings.model_copy(update=update)


def model_settings(settings: ServeSettings, entry: ModelEntry) -> ModelSettings:
    """The settings ``entry`` is served with: its own fields, over the flags given to the server
    that a model inherits (not the server's own, ``SERVER_WIDE``, nor ``--model``'s,
    ``OWN_FIELDS``; an engine flag only where the entry's engine reads it), named ``entry.name``.
    Raises ``ConfigError`` naming the model (a bad value, or a flag its engine does not use)."""
    engine = entry.fields.get("engine", settings.engine)
    engine_fields = frozenset().union(*(engine_settings(name) for name in ENGINES))
    try:
        used = engine_settings(engine)
    except KeyError:
        raise ConfigError(f"model {entry.name!r}: unknown engine {engine!r}; choose one of {sorted(ENGINES)}") from None
    inherited = {name: getattr(settings, name) for name in settings.model_fields_set
                 if name not in SERVER_WIDE | OWN_FIELDS and (name not in engine_fields or name in used)}
    try:
        own = ModelSettings(**{**inherited, **entry.fields, "served_model_name": entry.name})
    except ValidationError as exc:
        raise ConfigError(f"model {entry.name!r}: " + "; ".join(
            f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())) from None
    try:
        check_engine_settings(own)
    except EngineError as exc:
        raise ConfigError(f"model {entry.name!r}: {exc}") from None
    return own


def serve_many(settings: ServeSettings, default: LoadedModel, seal: ReasoningSeal | None = None) -> ModelRouter:
    """``--model`` (``default``, started, kept loaded unless evicted) and the models of
    ``--models-dir`` and ``--config``, loaded on demand under ``--max-loaded-models``,
    ``--memory-budget`` and ``--keep-alive``, each with ``seal`` (``start_model``). Raises
    ``ConfigError`` (a bad file or entry, two models of one name)."""
    entries = [entry for folder in settings.models_dir
               for entry in scan_models_dir(Path(folder).expanduser(), "vllm" if settings.engine == "vllm"
                                            else "transformers")]
    if settings.config:
        entries += read_config(Path(settings.config).expanduser())
    name = default.pipeline.name
    tables = {name: default.pipeline.adapter_table}
    specs = [ModelSpec(name, load=lambda: start_model(settings, adapters=tables[name], seal=seal), unload=_unload_frozen,
                       keep_alive=math.inf,
                       estimate=lambda: _memory_estimate(settings),
                       metadata={"engine": settings.engine})]
    for entry in entries:
        if entry.name == name:
            continue  # --model found again in a folder: served once, as --model
        own = model_settings(settings, entry)
        if entry.embedding and own.engine == "vllm":
            raise ConfigError(f"model {entry.name!r}: embedding: the vllm engine serves no embeddings; "
                              "use llama_cpp or transformers")
        if entry.embedding and own.engine == "llama_cpp" and "runner" not in entry.fields:
            own = own.model_copy(update={"runner": "pooling"})  # no generation context for it
        tables[entry.name] = AdapterTable(own.max_loras)
        specs.append(ModelSpec(entry.name, load=lambda own=own, aliases=entry.aliases, table=tables[entry.name]:
                               start_model(own, aliases, table, seal),
                               unload=LoadedModel.shutdown,
                               estimate=lambda own=own: _memory_estimate(own), aliases=entry.aliases,
                               keep_alive=entry.keep_alive,
                               metadata={"engine": own.engine, **({"embedding_only": True} if entry.embedding else {})}))
    try:
        registry: ModelRegistry[LoadedModel] = ModelRegistry(
            specs, max_loaded=settings.max_loaded_models, memory_budget=settings.memory_budget,
            keep_alive=parse_keep_alive(settings.keep_alive))
    except ValueError as exc:  # two models of one name
        raise ConfigError(str(exc)) from None
    registry.adopt(name, default)
    return ModelRouter(registry, name, tables)


def freeze_heap() -> None:
    """Collect, then move every object left to the collector's permanent generation
    (``gc.freeze``, as vLLM's server does after start-up): a server's long-lived heap (imports,
    started models) stays out of the full passes, each of which held the event loop, and so
    every stream, for ~85 ms here (``benchmarks/upload_stall.py``). Holds the interpreter's
    lock for a full pass (~0.1 s): at start-up, and when the model started then is unloaded."""
    gc.collect()
    gc.freeze()


def _unload_frozen(loaded: LoadedModel) -> None:
    """The unload of a model started before ``freeze_heap``: its objects are frozen, so the
    collector is let see them again (else a cycle among them would never be freed), then what
    is left is frozen again."""
    loaded.shutdown()
    gc.unfreeze()
    freeze_heap()


def _memory_estimate(settings: ModelSettings) -> int:
    """``engine.memory_estimate``, or 0 for a model its engine cannot read (its load fails and
    says why)."""
    try:
        return memory_estimate(settings)
    except EngineError as exc:
        log.warning("model %s: no memory estimate: %s", settings.served_model_name or settings.model, exc)
        return 0
