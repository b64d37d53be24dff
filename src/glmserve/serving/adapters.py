"""One model's LoRA adapters, one lifecycle for the three engines: which names are registered
(with their paths), which are loaded in the engine now, and the leases requests hold on them.

- A request for an adapter holds a lease on it from admission to its last byte (``acquire``);
  an adapter registered but not loaded now is loaded first.
- At most ``max_loras`` adapters are loaded at once (vLLM's ``--max-loras``): to load another,
  the least recently used one that no request holds is unloaded. It stays registered, and loads
  again from its path when a request names it. With every loaded adapter held, the request
  waits for one to be released.
- ``unload`` refuses the name to new requests at once, waits (no polling: an event set by the
  last release) until the last request holding it ended, and only then unloads it from the
  engine, so a request admitted for an adapter is always computed with it.
- The table outlives the model's engine: when the model is evicted and loaded again, ``attach``
  gives the table the new engine, and adapters loaded at run time load again at their first
  request (``tests/e2e/test_runtime_lora.py``).

Errors are ``APIError``: 404 for a name that is not registered (or is being unloaded), 400 for
an adapter the engine refuses."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from glmserve.engine.base import Engine, EngineError
from glmserve.protocol.errors import invalid_request, model_not_found

MAX_LORA_ADAPTERS = 64  # adapter names registered at once (each loaded one holds its weights)
DEFAULT_MAX_LORAS = 8  # --max-loras: adapters loaded in the engine at once


class AdapterTable:
    """The adapters of one model. ``max_loras``: loaded at once (at least 1). Used on the
    server's event loop only."""

    def __init__(self, max_loras: int = DEFAULT_MAX_LORAS) -> None:
        if max_loras < 1:
            raise ValueError("max_loras must be at least 1")
        self.max_loras = max_loras
        self.engine: Engine | None = None
        self._paths: dict[str, str | None] = {}  # registered, in order; None: cannot load again
        self._loaded: dict[str, None] = {}  # in the engine now, least recently used first
        self._leases: Counter[str] = Counter()
        self._unloading: set[str] = set()
        self._changed = asyncio.Event()  # replaced after each set: a release happened
        self._lock: asyncio.Lock | None = None  # one engine load/unload at a time

    def attach(self, engine: Engine, startup: dict[str, Path] | None = None) -> None:
        """Give the table the (started) engine of a new load of the model. ``startup``: the
        ``--lora`` adapters the engine loaded, with their paths (those the engine lists without
        a path here are never unloaded to make room). Adapters registered at run time for an
        earlier engine stay registered, to load at their first request."""
        self.engine = engine
        loaded = engine.model_info.lora_adapters
        paths = {name: str(path) for name, path in (startup or {}).items()}
        self._paths = {**{name: paths.get(name) for name in loaded}, **{
            name: path for name, path in self._paths.items() if name not in loaded and path is not None}}
        self._loaded = dict.fromkeys(loaded)
        self._leases.clear()
        self._unloading.clear()

    @property
    def names(self) -> tuple[str, ...]:
        """The adapters requests may name: registered and not being unloaded."""
        return tuple(name for name in self._paths if name not in self._unloading)

    @property
    def loaded(self) -> tuple[str, ...]:
        """The adapters in the engine now, least recently used first."""
        return tuple(self._loaded)

    def leases(self, name: str) -> int:
        return self._leases[name]

    async def acquire(self, name: str) -> Callable[[], None]:
        """A lease on adapter ``name`` for one request, loaded first if it is not; returns the
        release (idempotent). Raises ``APIError`` 404 (not registered, or being unloaded) or 400
        (the engine cannot load it now: its file is gone, say)."""
        if name not in self._loaded or name in self._unloading:  # a loaded one needs no lock
            async with self._guard():
                while True:
                    if name not in self.names:
                        raise model_not_found(name)
                    if name in self._loaded or await self._make_room():
                        break
                    await self._wait_for_release(holding_lock=True)
                if name not in self._loaded:
                    await self._engine_load(name, self._paths[name] or "")
        # no await from the check to the lease: an eviction takes an adapter out of _loaded
        # before it awaits the engine, so a loaded adapter leased here stays loaded
        self._loaded.pop(name, None)
        self._loaded[name] = None  # most recently used
        self._leases[name] += 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self._leases[name] -= 1
                self._signal()

        return release

    async def register(self, name: str, path: str, replace: bool) -> None:
        """Load ``path`` as adapter ``name`` (``/v1/load_lora_adapter``); ``replace``: the name
        is registered already and is loaded again from ``path`` once its requests ended. Raises
        ``APIError`` 400 (more than ``MAX_LORA_ADAPTERS`` names, or the engine refuses it: then
        the name is not registered)."""
        if not replace and len(self._paths) >= MAX_LORA_ADAPTERS:
            raise invalid_request(f"{MAX_LORA_ADAPTERS} LoRA adapters are registered, the most this server "
                                  "holds; unload one first", "lora_name")
        if replace:
            await self.unload(name)
        async with self._guard():
            while not await self._make_room():
                await self._wait_for_release(holding_lock=True)
            await self._engine_load(name, path, "lora_path")
            self._paths[name] = path
            self._loaded[name] = None

    async def unload(self, name: str) -> None:
        """Unregister ``name`` once the last request holding it ended (refused to new requests
        at once). Raises ``APIError`` 404 for a name not registered (or being unloaded)."""
        if name not in self.names:
            raise model_not_found(name)
        self._unloading.add(name)
        self._signal()
        try:
            while self._leases[name] > 0:
                await self._wait_for_release()
            async with self._guard():
                if name in self._loaded:
                    await self._engine_unload(name)
                self._paths.pop(name, None)
        finally:
            self._unloading.discard(name)

    async def _make_room(self) -> bool:
        """Unload least recently used idle adapters until one more fits; False when every loaded
        adapter is held (or cannot be loaded again)."""
        while len(self._loaded) >= self.max_loras:
            idle = [n for n in self._loaded if self._leases[n] == 0 and self._paths.get(n) is not None]
            if not idle:
                return False
            await self._engine_unload(idle[0])
        return True

    async def _engine_load(self, name: str, path: str, param: str = "model") -> None:
        try:
            await asyncio.shield(self._engine().load_lora_adapter(name, path))  # never left half loaded
        except EngineError as exc:  # LoRAAdapterError, or an engine that cannot load adapters
            raise invalid_request(str(exc), param) from exc

    async def _engine_unload(self, name: str) -> None:
        self._loaded.pop(name, None)
        await asyncio.shield(self._engine().unload_lora_adapter(name))

    def _engine(self) -> Engine:
        if self.engine is None:
            raise RuntimeError("AdapterTable.attach was not called")
        return self.engine

    def _guard(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    def _signal(self) -> None:
        event, self._changed = self._changed, asyncio.Event()
        event.set()

    async def _wait_for_release(self, holding_lock: bool = False) -> None:
        """Until the next release or unload; ``holding_lock``: the caller holds the lock, which
        is let go meanwhile."""
        event = self._changed
        if not holding_lock:
            await event.wait()
            return
        lock = self._guard()
        lock.release()
        try:
            await event.wait()
        finally:
            await lock.acquire()
