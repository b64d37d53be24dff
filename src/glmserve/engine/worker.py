"""The worker thread shared by the engines that run their own step loop (llama_cpp,
transformers): one loop, one abort path, one failure policy.

Requests reach the worker through an ``Inbox`` and aborts through an ``AbortSet``; between two
steps the worker takes both, then runs one engine step and hands the step's outputs to the
event loop(s) in one ``OutputBatch`` flush, or holds them for the next step's within
``--stream-interval-ms`` (nothing is held while the worker waits). An engine (vLLM) with an
async core of its own does not use this.

Failure policy: a step that raises ends the requests it was computing (the running ones) with
``finish_reason="error"`` and the exception's one-line message; the engine resets its batch
state (``_after_failed_step``) and goes on with the waiting requests. A request whose own
inputs break (a prefill of one request) is ended alone by the engine itself. On shutdown every
unfinished request ends with ``"abort"``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

from glmserve.engine.base import EngineError
from glmserve.engine.inbox import AbortSet, Inbox
from glmserve.engine.admission import AdmissionControl
from glmserve.engine.stream import OutputBatch, OutputStream
from glmserve.engine.types import EngineStats, FinishReason, GenerationOutput

if TYPE_CHECKING:
    from glmserve.engine.settings import EngineSettings

# --max-num-seqs when not set, on the engines that run this worker (llama_cpp, transformers): a
# CPU's batch, where each running sequence costs a whole n_ctx of KV cache (llama_cpp, split)
DEFAULT_MAX_NUM_SEQS = 8


def default_max_num_seqs(settings: EngineSettings) -> int:
    """``--max-num-seqs`` when it is not set, on the engines that run this worker."""
    return DEFAULT_MAX_NUM_SEQS


S = TypeVar("S")  # the engine's per-request state
R = TypeVar("R")


@dataclass(slots=True)
class _Call:
    """A function to run on the worker thread between two steps, and where its result goes."""

    fn: Callable[[], object]
    future: concurrent.futures.Future


class StepWorker(Generic[S]):
    """Base class of a step-loop engine. The engine implements the hooks below (all called on
    the worker thread) and calls ``_init_worker`` in ``__init__``, ``_start_worker`` at the end
    of ``start``, ``_stop_worker`` first in ``shutdown``."""

    log: logging.Logger

    # ---- hooks --------------------------------------------------------------------------

    def _has_work(self) -> bool:
        """Any request running or waiting."""
        raise NotImplementedError

    def _held_s(self) -> float:
        """Seconds the work there is is held back (nothing to compute until then unless a new
        request comes; 0: step now). Engines that hold no work keep this default."""
        return 0.0

    def _add(self, seq: S) -> None:
        """Take a new request from the inbox (it waits until the engine schedules it)."""
        raise NotImplementedError

    def _lookup(self, request_id: str) -> S | None:
        """The unfinished request with this id, if any."""
        raise NotImplementedError

    def _num_generated(self, seq: S) -> int:
        raise NotImplementedError

    def _step(self) -> None:
        """One engine step: schedule, compute, sample, ``_emit`` outputs."""
        raise NotImplementedError

    def _running(self) -> Iterable[S]:
        """The requests the current step computes."""
        raise NotImplementedError

    def _unfinished(self) -> Iterable[S]:
        """Every request running or waiting."""
        raise NotImplementedError

    def _finish(self, seq: S, reason: FinishReason, error: str | None = None, send: bool = True) -> None:
        """End ``seq`` (idempotent): free what it holds, ``_release`` it."""
        raise NotImplementedError

    def _after_aborts(self) -> None:
        """Called after aborted requests were finished (e.g. to compact a batch)."""

    def _after_failed_step(self) -> None:
        """Called after a failed step ended the running requests (reset the batch state)."""

    # ---- shared machinery ---------------------------------------------------------------

    def _init_worker(self, max_num_seqs: int, max_queue: int | None, stream_interval_ms: float = 0) -> None:
        """``stream_interval_ms``: how long a step's outputs may be held for later steps'
        (``--stream-interval-ms``; ``stream.py``)."""
        self._admission = AdmissionControl(max_num_seqs, max_queue)
        self._inbox: Inbox[S | _Call] = Inbox()
        self._aborts = AbortSet()
        self._outputs = OutputBatch(stream_interval_ms / 1000)
        self._thread: threading.Thread | None = None

    def _start_worker(self, name: str, setup: Callable[[], None] | None = None) -> None:
        """Start the worker thread. ``setup``, if given, runs first on that thread (e.g. loading
        a model whose library keeps per-thread state); this waits for it and re-raises what it
        raised, after which the thread has ended."""
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            if setup is not None:
                try:
                    setup()
                except BaseException as exc:  # handed to the starting thread
                    failure.append(exc)
                    ready.set()
                    return
            ready.set()
            self._worker()

        self._thread = threading.Thread(target=run, name=name, daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self._thread.join()
            self._thread = None
            raise failure[0]

    def _stop_worker(self) -> None:
        """Abort what is still running and stop the worker thread (waits up to 60 s)."""
        if self._thread is not None:
            self._inbox.close()
            self._thread.join(timeout=60)
            self._thread = None

    @property
    def _worker_running(self) -> bool:
        return self._thread is not None

    def _on_worker(self, fn: Callable[[], R]) -> Awaitable[R]:
        """Run ``fn`` on the worker thread between two steps (any thread; e.g. an embedding, which
        uses the model the steps use) and return an awaitable of its result or exception. Calls
        run in the order they are made, each between two steps, so running requests go on
        between them. Raises ``EngineError`` when the worker is not running (also in the
        awaitable, when the engine shuts down first)."""
        if not self._worker_running:
            raise EngineError("engine is not running")
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._inbox.put(_Call(fn, future))
        return asyncio.wrap_future(future)

    def _take(self, item: S | _Call) -> None:
        if not isinstance(item, _Call):
            self._add(item)
        elif item.future.set_running_or_notify_cancel():
            try:
                item.future.set_result(item.fn())
            except Exception as exc:  # the caller's to handle
                item.future.set_exception(exc)

    def abort(self, request_id: str) -> None:
        """Stop ``request_id`` at the next step (any thread)."""
        self._aborts.add(request_id)

    def stats(self) -> EngineStats:
        running, waiting = self._admission.split()
        return EngineStats(running, waiting, self._kv_cache_usage())

    def check_health(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            raise EngineError("the engine's worker thread is not running")

    def _kv_cache_usage(self) -> float | None:
        """The share of KV cache cells in use, if the engine knows it (any thread)."""
        return None

    def _release(self, stream: OutputStream, request_id: str, reason: FinishReason, error: str | None,
                 num_prompt: int, num_cached: int, send: bool, tenant: str | None) -> None:
        """Give the request's admission place back (its ``tenant``'s) and, when ``send``, its last output."""
        self._admission.release(tenant)
        if send:
            self._outputs.add(stream, GenerationOutput(request_id, finish_reason=reason, error=error,
                                                       num_prompt_tokens=num_prompt, num_cached_tokens=num_cached))

    def _worker(self) -> None:
        running = True
        while running:
            wait = self._held_s() if self._has_work() else None
            if wait != 0:  # no step follows at once: what is held goes now
                self._outputs.flush()
            running = self._inbox.drain(wait, self._take)
            self._apply_aborts()
            if not running:
                break
            start = time.perf_counter()
            try:
                self._step()
            except Exception as exc:  # see the failure policy in the module docstring
                self.log.exception("engine step failed")
                for seq in list(self._running()):
                    self._finish(seq, "error", f"{type(exc).__name__}: {exc}")
                self._after_failed_step()
            self._outputs.step_done(time.perf_counter() - start)
        self._inbox.drain(0, self._take_after_close)
        for seq in list(self._unfinished()):
            self._finish(seq, "abort")
        self._outputs.flush()

    def _take_after_close(self, item: S | _Call) -> None:
        """What reached the inbox after shutdown began: requests end with "abort", calls fail."""
        if isinstance(item, _Call):
            item.future.set_exception(EngineError("the engine is shutting down"))
        else:
            self._add(item)

    def _end_where(self, pick: Callable[[S], bool], error: str) -> None:
        """End (worker thread) every unfinished request ``pick`` selects, with ``error``: those of
        a LoRA adapter being unloaded. The serving layer unloads an adapter only after its last
        request ended (``serving/adapters.py``), so only requests already aborted meet this."""
        ended = [seq for seq in self._unfinished() if pick(seq)]
        for seq in ended:
            self._finish(seq, "error", error)
        if ended:
            self._after_aborts()

    def _apply_aborts(self) -> None:
        hit = False
        for request_id in self._aborts.take():
            seq = self._lookup(request_id)
            if seq is not None:
                self.log.info("request %s aborted after %d tokens", request_id, self._num_generated(seq))
                self._finish(seq, "abort")
                hit = True
        if hit:
            self._after_aborts()
