"""Many models in one server: the servable models by name, each loaded on demand
of its own (engine and services) and unloaded when idle.

After llama-server's router mode (``/models/load``, ``/models/unload``, a model loads on its
first request) and Ollama's ``keep_alive`` (how long a model stays loaded after its last
request: a duration, ``0`` unload at once, negative keep loaded):

- ``acquire(name)`` returns a ``Lease`` on the model once loaded, loading it first when it is not
  loaded; concurrent acquirers of a model that is loading wait on that one load. A model with a
  lease (running requests) is never unloaded.
- Before a load, the least recently used idle models are unloaded until the new one fits
  ``max_loaded`` models and ``memory_budget`` bytes (each model's ``ModelSpec.estimate()``,
  taken before its first load: file sizes plus the KV cache). When only busy models are in the way, the load waits for one to go
  idle, up to ``wait_s`` seconds (then ``RegistryFull``).
- A model that fails to load raises ``ModelLoadError`` naming it and the cause to the requests
  that waited on that load, and wakes the loads waiting for room at once; the other models go
  on. It is tried again only after a back-off (``LOAD_RETRY_S``: 1 s, doubling to 60 s); a
  request before then gets the last failure at once.
- A loaded model counts against ``max_loaded`` and ``memory_budget`` until it is freed: a model
  unloaded by ``keep_alive: 0`` is unloaded at once for requests, but a load that needs its room
  waits for its engine to be freed. ``alive``/``peak_alive``: loaded models not yet freed, now and
  at most.
- Every change of a model's status is published to ``subscribe()``'s queues (``/models/events``).

The registry knows nothing of engines: ``ModelSpec.load`` builds and starts a model and
``ModelSpec.unload`` stops it (both blocking; run on a worker thread). Used from one event loop.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic

from glmserve.engine.base import one_line
from glmserve.runtime.registry_types import (
    Lease,
    ModelLoadError,
    ModelSpec,
    ModelStatus,
    RegistryError,
    RegistryFull,
    R,
    UnknownModel,
)

__all__ = ["Lease", "ModelLoadError", "ModelRegistry", "ModelSpec", "ModelStatus", "RegistryError", "RegistryFull",
           "UnknownModel"]

LOAD_RETRY_S = (1.0, 60.0)  # back-off after a failed load: the first, the longest (doubling)
log = logging.getLogger("glmserve.registry")


@dataclass(slots=True, eq=False)
class _Entry(Generic[R]):
    spec: ModelSpec[R]
    status: ModelStatus = ModelStatus.UNLOADED
    loaded: R | None = None
    loading: asyncio.Task | None = None
    unloading: asyncio.Task | None = None  # a keep_alive 0 unload still freeing the model
    leases: int = 0
    last_used: float = 0.0
    keep_alive: float = 0.0  # seconds idle before unloading, as the last request asked
    error: str | None = None  # the last load failure
    failures: int = 0  # failed loads in a row
    retry_at: float = 0.0  # no load before this (clock seconds), after a failure
    size_bytes: int | None = None  # spec.estimate(), once known
    idle: asyncio.Event = field(default_factory=asyncio.Event)  # set while no lease is held


class ModelRegistry(Generic[R]):
    """See module docstring. ``max_loaded``: models loaded at once (None: no limit);
    ``memory_budget``: bytes of ``size_bytes`` loaded at once (None: no limit); ``keep_alive``:
    default idle seconds before unloading (``math.inf``: never); ``wait_s``: how long a load
    waits for busy models to go idle; ``clock``: monotonic seconds (tests pass their own)."""

    def __init__(self, specs: list[ModelSpec[R]], max_loaded: int | None = None, memory_budget: int | None = None,
                 keep_alive: float = 300.0, wait_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._entries: dict[str, _Entry[R]] = {}
        self._names: dict[str, _Entry[R]] = {}
        for spec in specs:
            entry = _Entry(spec)
            entry.idle.set()
            self._entries[spec.name] = entry
            for name in (spec.name, *spec.aliases):
                if name in self._names:
                    raise ValueError(f"two models are named {name!r}")
                self._names[name] = entry
        self.max_loaded = max_loaded
        self.memory_budget = memory_budget
        self.keep_alive = keep_alive
        self.wait_s = wait_s
        self._clock = clock
        self._lock = asyncio.Lock()  # eviction decisions and starting loads
        self._changed = asyncio.Condition(self._lock)  # a lease was released or a model unloaded
        self._subscribers: set[asyncio.Queue] = set()
        self._expiry: asyncio.TimerHandle | None = None
        self.alive = 0  # models loaded and not yet freed
        self.peak_alive = 0

    # ---- reading ------------------------------------------------------------------------

    def resolve(self, name: str) -> str:
        """The model's own name for ``name`` (a name or an alias). Raises ``UnknownModel``."""
        entry = self._names.get(name)
        if entry is None:
            raise UnknownModel(name, f"The model '{name}' does not exist or you do not have access to it.")
        return entry.spec.name

    def names(self) -> list[str]:
        """Every model's name and aliases."""
        return list(self._names)

    def metadata(self, name: str) -> dict[str, Any]:
        """``ModelSpec.metadata`` of model ``name`` (a name or an alias). Raises ``UnknownModel``."""
        return self._entries[self.resolve(name)].spec.metadata

    def status(self) -> list[dict[str, Any]]:
        """Every model, in the order given: ``model``, ``aliases``, ``status``, ``error`` (the last
        load failure), ``running`` (leases held), ``metadata``."""
        return [{"model": e.spec.name, "aliases": list(e.spec.aliases), "status": e.status.value, "error": e.error,
                 "running": e.leases, "metadata": e.spec.metadata} for e in self._entries.values()]

    def loaded(self) -> list[str]:
        return [name for name, e in self._entries.items() if e.status is ModelStatus.LOADED]

    def loaded_models(self) -> dict[str, R]:
        """{name: loaded model} of the loaded models."""
        return {name: e.loaded for name, e in self._entries.items() if e.status is ModelStatus.LOADED}

    def adopt(self, name: str, loaded: R) -> None:
        """Mark model ``name`` loaded with ``loaded``, started by the caller (a model loaded at
        start-up)."""
        entry = self._entries[self.resolve(name)]
        if entry.status is not ModelStatus.UNLOADED:
            raise ValueError(f"model {name!r} is {entry.status.value}")
        entry.loaded, entry.status, entry.last_used = loaded, ModelStatus.LOADED, self._clock()
        entry.keep_alive = self._keep_alive(entry, None)
        self._count_loaded()
        if self.memory_budget is not None:
            entry.size_bytes = entry.spec.estimate()

    def status_of(self, name: str) -> str:
        """``loaded``, ``loading`` or ``unloaded``. Raises ``UnknownModel``."""
        return self._entries[self.resolve(name)].status.value

    def pinned(self, name: str) -> bool:
        """Whether model ``name`` is never unloaded. Raises ``UnknownModel``."""
        return self._entries[self.resolve(name)].spec.pinned

    def _count_loaded(self) -> None:
        self.alive += 1
        self.peak_alive = max(self.peak_alive, self.alive)

    async def _free(self, entry: _Entry[R], loaded: R) -> None:
        try:
            await asyncio.to_thread(entry.spec.unload, loaded)
        finally:
            self.alive -= 1

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    def subscribe(self) -> asyncio.Queue:
        """A queue of status events (``{"model", "status", "error"}``), starting with the status
        of every model; ``unsubscribe`` it when done."""
        queue: asyncio.Queue = asyncio.Queue()
        for item in self.status():
            queue.put_nowait({"model": item["model"], "status": item["status"], "error": item["error"]})
        self._subscribers.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue) -> None:
        self._subscribers.discard(queue)

    def _publish(self, entry: _Entry[R]) -> None:
        event = {"model": entry.spec.name, "status": entry.status.value, "error": entry.error}
        for queue in self._subscribers:
            queue.put_nowait(event)

    # ---- leases -------------------------------------------------------------------------

    async def acquire(self, name: str, keep_alive: float | None = None) -> Lease[R]:
        """A lease on model ``name``, loaded first if needed. ``keep_alive``: seconds the model
        stays loaded once idle after this request (0: unload at once; ``math.inf``: keep; None:
        the model's or the registry's default). Raises ``UnknownModel``, ``ModelLoadError`` or
        ``RegistryFull``."""
        entry = self._names.get(name)
        if entry is None:
            self.resolve(name)
        while True:
            # no await between the check and the lease: an unload marks a model unloaded before it
            # awaits anything, so a loaded model needs no lock (and waits for no other model's work)
            if entry.status is ModelStatus.LOADED:
                entry.leases += 1
                entry.idle.clear()
                entry.last_used = self._clock()
                entry.keep_alive = self._keep_alive(entry, keep_alive)
                return Lease(entry.loaded, entry.spec.name, lambda: self._release(entry))
            async with self._lock:
                if entry.status is ModelStatus.LOADED:
                    continue
                if entry.loading is None and entry.error is not None and self._clock() < entry.retry_at:
                    raise ModelLoadError(entry.spec.name, f"{entry.error} (it is tried again in "
                                         f"{entry.retry_at - self._clock():.0f} s)")
                if entry.loading is None:
                    entry.loading = asyncio.get_running_loop().create_task(self._load(entry))
                task = entry.loading
            await asyncio.shield(task)  # raises the load's error; a caller that leaves does not cancel it

    def _keep_alive(self, entry: _Entry[R], asked: float | None) -> float:
        if entry.spec.pinned:
            return math.inf
        if asked is not None:
            return math.inf if asked < 0 else asked
        return self.keep_alive if entry.spec.keep_alive is None else entry.spec.keep_alive

    def _release(self, entry: _Entry[R]) -> None:
        entry.leases -= 1
        entry.last_used = self._clock()
        if entry.leases == 0:
            entry.idle.set()
            loop = asyncio.get_running_loop()
            if entry.keep_alive == 0 and entry.status is ModelStatus.LOADED:
                # unloaded as of now (the next request loads it again); the model is freed behind
                loaded, entry.loaded, entry.status = entry.loaded, None, ModelStatus.UNLOADED
                log.info("unloading model %s (keep_alive 0)", entry.spec.name)
                self._publish(entry)
                entry.unloading = loop.create_task(self._free(entry, loaded))
                # a load waiting for room is woken once the engine is freed
                entry.unloading.add_done_callback(lambda _: loop.create_task(self._notify()))
            loop.create_task(self._after_release())

    async def _after_release(self) -> None:
        await self._notify()
        await self.expire_idle()

    # ---- loading and unloading ------------------------------------------------------------

    async def load(self, name: str) -> None:
        """Load model ``name`` now (``POST /models/load``); no lease is kept. Raises as
        ``acquire`` does."""
        (await self.acquire(name)).release()

    async def _load(self, entry: _Entry[R]) -> None:
        spec = entry.spec
        if entry.unloading is not None:  # the model of a keep_alive 0 request is still being freed
            await asyncio.gather(entry.unloading, return_exceptions=True)
            entry.unloading = None
        try:
            if entry.size_bytes is None and self.memory_budget is not None:
                entry.size_bytes = await asyncio.to_thread(spec.estimate)
            async with self._lock:
                await self._make_room(entry)
                entry.status, entry.error = ModelStatus.LOADING, None
                self._publish(entry)
            log.info("loading model %s", spec.name)
            start = self._clock()
            try:
                loaded = await asyncio.to_thread(spec.load)
            except Exception as exc:
                log.warning("model %s failed to load: %s", spec.name, one_line(exc))
                raise ModelLoadError(spec.name, f"model '{spec.name}' failed to load: {one_line(exc)}") from exc
            log.info("model %s loaded in %.1f s", spec.name, self._clock() - start)
            async with self._lock:
                entry.loaded, entry.status, entry.failures = loaded, ModelStatus.LOADED, 0
                entry.last_used = self._clock()
                self._count_loaded()
                self._publish(entry)
        except RegistryError as exc:
            async with self._lock:
                entry.status, entry.error = ModelStatus.UNLOADED, str(exc)
                if isinstance(exc, ModelLoadError):
                    first, longest = LOAD_RETRY_S
                    entry.failures += 1
                    entry.retry_at = self._clock() + min(longest, first * 2 ** (entry.failures - 1))
                self._publish(entry)
                self._changed.notify_all()  # its room is free again: loads waiting for room go on
            raise
        finally:
            entry.loading = None

    async def _make_room(self, entry: _Entry[R]) -> None:
        """Unload least recently used idle models until ``entry`` fits (the lock is held, and
        released while waiting for a busy model to go idle). Raises ``ModelLoadError`` for a
        model larger than the whole budget, ``RegistryFull`` after ``wait_s``."""
        size = entry.size_bytes or 0
        if self.memory_budget is not None and size > self.memory_budget:
            raise ModelLoadError(entry.spec.name, f"model '{entry.spec.name}' needs about {size} bytes, more than "
                                 f"the memory budget of {self.memory_budget} bytes")
        deadline = self._clock() + self.wait_s
        while not self._fits(entry):
            freeing = [e.unloading for e in self._entries.values()
                       if e is not entry and e.unloading is not None and not e.unloading.done()]
            if freeing:  # engines of keep_alive 0 unloads still being freed: their room comes back
                await asyncio.gather(*freeing, return_exceptions=True)
                continue
            idle = [e for e in self._entries.values()
                    if e is not entry and e.status is ModelStatus.LOADED and e.leases == 0 and not e.spec.pinned]
            if idle:
                await self._unload(min(idle, key=lambda e: e.last_used), "to make room for " + entry.spec.name)
                continue
            remaining = deadline - self._clock()
            if remaining <= 0:
                busy = [e.spec.name for e in self._entries.values() if e.status is not ModelStatus.UNLOADED]
                raise RegistryFull(entry.spec.name, f"model '{entry.spec.name}' does not fit beside the models in "
                                   f"use ({', '.join(busy)}); try again when they are idle")
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except TimeoutError:
                pass

    def _fits(self, entry: _Entry[R]) -> bool:
        held = [e for e in self._entries.values() if e is not entry and (
            e.status is not ModelStatus.UNLOADED or (e.unloading is not None and not e.unloading.done()))]
        if self.max_loaded is not None and len(held) + 1 > self.max_loaded:
            return False
        if self.memory_budget is not None:
            return sum(e.size_bytes or 0 for e in held) + (entry.size_bytes or 0) <= self.memory_budget
        return True

    async def _unload(self, entry: _Entry[R], why: str) -> None:
        """Stop ``entry``'s loaded model (lock held; it has no lease)."""
        loaded, entry.loaded = entry.loaded, None
        entry.status = ModelStatus.UNLOADED
        log.info("unloading model %s (%s)", entry.spec.name, why)
        self._publish(entry)
        if loaded is not None:
            await self._free(entry, loaded)
        self._changed.notify_all()

    async def unload(self, name: str, wait_s: float | None = None) -> bool:
        """Unload model ``name`` (``POST /models/unload``) once its running requests end (up to
        ``wait_s`` seconds, default ``self.wait_s``). Returns False when it was not loaded (or is pinned).
        Raises ``UnknownModel``, or ``RegistryFull`` when it stayed busy."""
        entry = self._entries[self.resolve(name)]
        if entry.spec.pinned:
            return False
        if entry.loading is not None:
            try:
                await asyncio.shield(entry.loading)
            except RegistryError:  # the load failed: the model is not loaded
                return False
        try:
            await asyncio.wait_for(entry.idle.wait(), self.wait_s if wait_s is None else wait_s)
        except TimeoutError:
            raise RegistryFull(name, f"model '{name}' is still serving requests") from None
        async with self._lock:
            if entry.status is not ModelStatus.LOADED or entry.leases:
                return False
            await self._unload(entry, "on request")
        return True

    async def expire_idle(self) -> None:
        """Unload every idle model whose keep-alive has run out, then arm a timer for the next
        one to run out."""
        async with self._lock:
            now = self._clock()
            for entry in self._entries.values():
                if (entry.status is ModelStatus.LOADED and entry.leases == 0
                        and entry.last_used + entry.keep_alive <= now):
                    await self._unload(entry, "idle")
        self._schedule_expiry()

    def _schedule_expiry(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        deadlines = [e.last_used + e.keep_alive for e in self._entries.values()
                     if e.status is ModelStatus.LOADED and e.leases == 0 and math.isfinite(e.keep_alive)]
        if deadlines:
            loop = asyncio.get_running_loop()
            delay = max(0.0, min(deadlines) - self._clock())
            self._expiry = loop.call_later(delay, lambda: loop.create_task(self.expire_idle()))

    async def settle(self) -> None:
        """Wait until the models unloaded by ``keep_alive: 0`` are freed."""
        await asyncio.gather(*(e.unloading for e in self._entries.values() if e.unloading is not None),
                             return_exceptions=True)

    async def close(self) -> None:
        """Unload every loaded model (server shutdown), whatever its leases."""
        if self._expiry is not None:
            self._expiry.cancel()
        await self.settle()
        async with self._lock:
            for entry in self._entries.values():
                if entry.status is ModelStatus.LOADED:
                    await self._unload(entry, "shutdown")
