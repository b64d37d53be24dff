"""The model registry's vocabulary: a servable model (``ModelSpec``), its status, and the
errors a request for it can meet (``runtime/registry.py`` uses them; ``runtime/router.py`` maps
the errors to API errors)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Generic, TypeVar

R = TypeVar("R")  # a loaded model (runtime.loaded.LoadedModel in the server)


class ModelStatus(str, Enum):
    UNLOADED = "unloaded"
    LOADING = "loading"
    LOADED = "loaded"


class RegistryError(Exception):
    """Base of the registry's errors; ``model`` is the name asked for."""

    def __init__(self, model: str, message: str) -> None:
        super().__init__(message)
        self.model = model


class UnknownModel(RegistryError):
    """No servable model or alias has this name."""


class ModelLoadError(RegistryError):
    """The model failed to load (bad file, out of memory, larger than the memory budget)."""


class RegistryFull(RegistryError):
    """The model does not fit beside the busy models, and none went idle in time."""


@dataclass(slots=True)
class ModelSpec(Generic[R]):
    """One servable model. ``load()`` returns the model started (blocking; raises on failure),
    ``unload(loaded)`` stops it; ``estimate()``: bytes it takes once loaded (blocking, called
    once, before its first load; must not raise); ``keep_alive``: seconds
    it stays loaded when idle (None: the registry's default; ``math.inf``: until unloaded by
    hand or evicted)."""

    name: str
    load: Callable[[], R]
    unload: Callable[[R], None]
    estimate: Callable[[], int] = lambda: 0
    aliases: tuple[str, ...] = ()
    keep_alive: float | None = None
    metadata: dict[str, Any] = field(default_factory=dict)  # shown as it is, e.g. the engine's name
    pinned: bool = False  # never unloaded (keep_alive and eviction do not apply): a server of one model


class Lease(Generic[R]):
    """A hold on a loaded model: ``loaded`` (of the model named ``model``) stays loaded until
    ``release()`` (idempotent; also on leaving ``async with``), which calls ``on_release`` (the
    registry's count of the model's holds)."""

    def __init__(self, loaded: R, model: str, on_release: Callable[[], None]) -> None:
        self.loaded, self.model = loaded, model
        self._on_release = on_release
        self._released = False
        self._then: list[Callable[[], None]] = []

    def also_release(self, release: Callable[[], None]) -> None:
        """Call ``release`` too when this lease is released (a LoRA adapter's lease)."""
        self._then.append(release)

    def release(self) -> None:
        if not self._released:
            self._released = True
            for release in self._then:
                release()
            self._on_release()

    async def __aenter__(self) -> Lease[R]:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release()
