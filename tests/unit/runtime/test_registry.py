"""The model registry over fake loaded models and a fake clock: one load for concurrent first
requests, least-recently-used idle models unloaded under ``max_loaded`` and ``memory_budget``,
busy models never, keep_alive (0, a duration, forever), a failing model that leaves the others
serving, explicit load/unload, and the status events."""

from __future__ import annotations

import asyncio
import math
import threading

import pytest

from glmserve.runtime.registry import (
    ModelLoadError,
    ModelRegistry,
    ModelSpec,
    RegistryFull,
    UnknownModel,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Models:
    """Fake loaded models: ``loads``/``unloads`` count calls per model; a model in ``broken`` fails
    to load; ``gate`` (when set) holds loads until it is set."""

    def __init__(self) -> None:
        self.loads: dict[str, int] = {}
        self.unloads: dict[str, int] = {}
        self.broken: set[str] = set()
        self.gate: threading.Event | None = None
        self.unload_gate: threading.Event | None = None  # holds unloads (an engine slow to free)

    def spec(self, name: str, size: int = 0, **kw) -> ModelSpec:
        def load():
            if self.gate is not None:
                self.gate.wait(10)
            self.loads[name] = self.loads.get(name, 0) + 1
            if name in self.broken:
                raise OSError(f"{name}.gguf: not a GGUF file")
            return f"loaded of {name}"

        def unload(loaded):
            assert loaded == f"loaded of {name}"
            if self.unload_gate is not None:
                self.unload_gate.wait(10)
            self.unloads[name] = self.unloads.get(name, 0) + 1

        return ModelSpec(name, load, unload, lambda: size, **kw)


def run(coro):
    return asyncio.run(coro)


def test_concurrent_first_requests_share_one_load():
    models = Models()
    models.gate = threading.Event()

    async def main():
        registry = ModelRegistry([models.spec("a")])
        tasks = [asyncio.create_task(registry.acquire("a")) for _ in range(5)]
        await asyncio.sleep(0.05)
        assert registry.status()[0]["status"] == "loading"
        models.gate.set()
        leases = await asyncio.gather(*tasks)
        assert {lease.loaded for lease in leases} == {"loaded of a"}
        assert registry.status()[0]["running"] == 5
        for lease in leases:
            lease.release()
        await registry.close()

    run(main())
    assert models.loads == {"a": 1} and models.unloads == {"a": 1}


def test_max_loaded_unloads_the_least_recently_used_idle_model():
    models, clock = Models(), Clock()

    async def main():
        registry = ModelRegistry([models.spec("a"), models.spec("b"), models.spec("c")], max_loaded=2, clock=clock)
        for name in ("a", "b"):
            async with await registry.acquire(name):
                clock.now += 1
        async with await registry.acquire("a"):  # a is now the most recently used
            clock.now += 1
        async with await registry.acquire("c"):
            assert registry.loaded() == ["a", "c"]
        assert models.unloads == {"b": 1}
        await registry.close()

    run(main())


def test_memory_budget_and_a_model_larger_than_it():
    models = Models()

    async def main():
        registry = ModelRegistry([models.spec("small", 40), models.spec("mid", 50), models.spec("huge", 200)],
                                 memory_budget=100)
        async with await registry.acquire("small"):
            pass
        async with await registry.acquire("mid"):
            assert registry.loaded() == ["small", "mid"]  # 90 of 100
        with pytest.raises(ModelLoadError, match="more than the memory budget"):
            await registry.acquire("huge")
        assert registry.loaded() == ["small", "mid"]  # nothing was unloaded for it
        await registry.close()

    run(main())


def test_a_busy_model_is_never_unloaded():
    models = Models()

    async def main():
        registry = ModelRegistry([models.spec("a"), models.spec("b")], max_loaded=1, wait_s=0.2)
        lease = await registry.acquire("a")
        with pytest.raises(RegistryFull, match="does not fit beside the models in use"):
            await registry.acquire("b")
        assert registry.loaded() == ["a"] and lease.loaded == "loaded of a"
        # once a goes idle, b's load goes ahead (a waiting load is woken by the release)
        waiting = asyncio.create_task(registry.acquire("b"))
        await asyncio.sleep(0.05)
        lease.release()
        (await waiting).release()
        assert registry.loaded() == ["b"]
        await registry.close()

    run(main())
    assert models.loads == {"a": 1, "b": 1}


def test_keep_alive():
    models, clock = Models(), Clock()

    async def main():
        registry = ModelRegistry([models.spec("a"), models.spec("b", keep_alive=math.inf)], keep_alive=300,
                                 clock=clock)
        async with await registry.acquire("a", keep_alive=0):
            pass
        assert registry.loaded() == []  # unloaded as the lease ends
        await registry.settle()
        assert models.unloads == {"a": 1}
        async with await registry.acquire("a"):  # the default: 300 s
            pass
        async with await registry.acquire("b"):
            pass
        clock.now += 299
        await registry.expire_idle()
        assert registry.loaded() == ["a", "b"]
        clock.now += 2
        await registry.expire_idle()
        assert registry.loaded() == ["b"]  # b's own keep_alive: forever
        async with await registry.acquire("b", keep_alive=10):  # a request's keep_alive wins
            pass
        clock.now += 11
        await registry.expire_idle()
        assert registry.loaded() == []
        async with await registry.acquire("a", keep_alive=-1):  # negative: keep
            pass
        clock.now += 10**6
        await registry.expire_idle()
        assert registry.loaded() == ["a"]
        await registry.close()

    run(main())


def test_a_broken_model_fails_alone_and_is_tried_again_after_a_back_off():
    models, clock = Models(), Clock()
    models.broken.add("bad")

    async def main():
        registry = ModelRegistry([models.spec("good"), models.spec("bad")], clock=clock)
        results = await asyncio.gather(registry.acquire("bad"), registry.acquire("bad"), return_exceptions=True)
        assert all(isinstance(r, ModelLoadError) for r in results)
        assert "model 'bad' failed to load: bad.gguf: not a GGUF file" in str(results[0])
        status = {s["model"]: s for s in registry.status()}
        assert status["bad"]["status"] == "unloaded" and "not a GGUF file" in status["bad"]["error"]
        async with await registry.acquire("good") as lease:
            assert lease.loaded == "loaded of good"
        # within the back-off, the last failure at once, without a load
        with pytest.raises(ModelLoadError, match="not a GGUF file .it is tried again in 1 s"):
            await registry.acquire("bad")
        assert models.loads["bad"] == 1  # the two concurrent requests shared one failed load
        clock.now += 1.5
        with pytest.raises(ModelLoadError):  # tried again; failed again: the back-off doubles
            await registry.acquire("bad")
        assert models.loads["bad"] == 2
        models.broken.clear()
        clock.now += 1.5
        with pytest.raises(ModelLoadError, match="tried again in 0 s"):
            await registry.acquire("bad")
        clock.now += 1
        async with await registry.acquire("bad") as lease:  # fixed: the next load after the back-off
            assert lease.loaded == "loaded of bad"
        assert {s["model"]: s["error"] for s in registry.status()}["bad"] is None
        await registry.close()

    run(main())
    assert models.loads["bad"] == 3


def test_a_failed_load_wakes_the_loads_waiting_for_its_room():
    models = Models()
    models.broken.add("bad")

    async def main():
        registry = ModelRegistry([models.spec("busy"), models.spec("bad"), models.spec("next")], max_loaded=2,
                                 wait_s=60)
        lease = await registry.acquire("busy")
        models.gate = threading.Event()
        bad = asyncio.create_task(registry.acquire("bad"))  # loading: it holds the second place
        await asyncio.sleep(0.05)
        waiting = asyncio.create_task(registry.acquire("next"))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        models.gate.set()
        with pytest.raises(ModelLoadError):
            await bad
        # woken by the failure, not after wait_s (60 s)
        (await asyncio.wait_for(waiting, 5)).release()
        lease.release()
        await registry.close()

    run(main())


def test_keep_alive_0_then_a_load_never_holds_two_engines():
    """The engine of a keep_alive 0 request is freed behind the reply; a load that needs its
    room waits until it is freed (counted by the registry's own accounting)."""
    models = Models()

    async def main():
        registry = ModelRegistry([models.spec("a"), models.spec("b")], max_loaded=1, wait_s=30)
        async with await registry.acquire("a", keep_alive=0):
            models.unload_gate = threading.Event()
        assert registry.loaded() == [] and registry.alive == 1  # a is unloaded for requests, not yet freed
        loading = asyncio.create_task(registry.acquire("b"))
        await asyncio.sleep(0.1)
        assert not loading.done() and models.loads == {"a": 1}  # b waits for a's engine
        models.unload_gate.set()
        (await asyncio.wait_for(loading, 5)).release()
        assert registry.peak_alive == 1 and registry.loaded() == ["b"]
        await registry.close()
        assert registry.alive == 0

    run(main())


def test_names_aliases_and_unknown_models():
    models = Models()

    async def main():
        registry = ModelRegistry([models.spec("glm-4-9b", aliases=("glm-4",))])
        assert registry.resolve("glm-4") == "glm-4-9b"
        async with await registry.acquire("glm-4") as lease:
            assert lease.model == "glm-4-9b"
        with pytest.raises(UnknownModel, match="'nope' does not exist"):
            await registry.acquire("nope")
        await registry.close()

    run(main())
    with pytest.raises(ValueError, match="two models are named 'x'"):
        ModelRegistry([models.spec("x"), models.spec("y", aliases=("x",))])


def test_explicit_load_unload_and_events():
    models = Models()

    async def main():
        registry = ModelRegistry([models.spec("a"), models.spec("b")])
        events = registry.subscribe()
        await registry.load("a")
        assert registry.loaded() == ["a"]
        lease = await registry.acquire("a")
        with pytest.raises(RegistryFull, match="still serving"):
            await registry.unload("a", wait_s=0.05)
        unloading = asyncio.create_task(registry.unload("a"))
        await asyncio.sleep(0.05)
        assert not unloading.done()  # waits for the running request
        lease.release()
        assert await unloading is True
        assert await registry.unload("a") is False
        seen = []
        while not events.empty():
            event = events.get_nowait()
            seen.append((event["model"], event["status"]))
        assert seen == [("a", "unloaded"), ("b", "unloaded"), ("a", "loading"), ("a", "loaded"), ("a", "unloaded")]
        registry.unsubscribe(events)
        await registry.close()

    run(main())


def test_a_pinned_model_stays():
    models = Models()

    async def main():
        registry = ModelRegistry([models.spec("one", pinned=True), models.spec("other")], max_loaded=1, wait_s=0.1)
        await registry.load("one")
        async with await registry.acquire("one", keep_alive=0):
            pass
        await registry.expire_idle()
        assert registry.loaded() == ["one"]
        assert await registry.unload("one") is False
        with pytest.raises(RegistryFull):  # not evicted to make room either
            await registry.acquire("other")
        await registry.close()

    run(main())
    assert models.loads == {"one": 1}


def test_unloading_a_model_whose_load_fails():
    """``POST /models/unload`` during a load that fails: not loaded, said so (it was a 500)."""
    models = Models()
    models.broken.add("bad")

    async def main():
        registry = ModelRegistry([models.spec("bad")])
        models.gate = threading.Event()
        loading = asyncio.create_task(registry.acquire("bad"))
        await asyncio.sleep(0.05)
        unloading = asyncio.create_task(registry.unload("bad"))
        await asyncio.sleep(0.05)
        models.gate.set()
        with pytest.raises(ModelLoadError):
            await loading
        assert await unloading is False and registry.status_of("bad") == "unloaded"
        await registry.close()

    run(main())
