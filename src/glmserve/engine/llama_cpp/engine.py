"""The ``llama_cpp`` engine: GGUF models on the CPU through llama-cpp-python.

One worker thread owns the ``llama_cpp.Llama`` context and runs requests one at a time, token
by token, checking for aborts between tokens; the event loop only waits on queues. Sampling is
llama.cpp's own sampler chain (in C). Prompt prefixes still in the KV cache from the previous
request are reused (``Llama.generate``'s prefix match) and reported as cached tokens.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass

import llama_cpp

from glmserve.engine.base import EngineError
from glmserve.engine.llama_cpp.tokenizer import IncrementalDecoder, LlamaCppTokenizer
from glmserve.engine.stream import OutputStream
from glmserve.engine.types import GenerationOutput, GenerationRequest, ModelInfo
from glmserve.models import ResolvedModel

log = logging.getLogger("glmserve.engine.llama_cpp")

_RANDOM_SEED = 0xFFFFFFFF  # llama.cpp's LLAMA_DEFAULT_SEED: "pick a random seed"


def _llama_seed(seed: int | None) -> int:
    """A 32-bit llama.cpp seed; never the value llama.cpp reads as "random"."""
    if seed is None:
        return random.getrandbits(31)
    value = seed & 0xFFFFFFFF
    return value - 1 if value == _RANDOM_SEED else value


@dataclass(slots=True)
class _Job:
    request: GenerationRequest
    stream: OutputStream


class LlamaCppEngine:
    """See module docstring. ``n_ctx`` 0 means the model's training context."""

    def __init__(self, model: ResolvedModel, n_ctx: int, n_threads: int, n_batch: int) -> None:
        self._model = model
        self._n_ctx = n_ctx
        self._n_threads = n_threads
        self._n_batch = n_batch
        self._llm: llama_cpp.Llama | None = None
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self._active: set[str] = set()
        self._aborted: set[str] = set()
        self._thread: threading.Thread | None = None
        self.tokenizer: LlamaCppTokenizer
        self.model_info: ModelInfo

    # ---- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        path = self._model.path
        try:
            self._llm = llama_cpp.Llama(
                model_path=str(path),
                n_ctx=self._n_ctx,
                n_batch=self._n_batch,
                n_threads=self._n_threads,
                n_threads_batch=self._n_threads,
                verbose=False,
            )
        except (ValueError, RuntimeError, OSError) as exc:
            raise EngineError(f"cannot load {path}: {exc}") from exc
        self.tokenizer = LlamaCppTokenizer(self._llm)
        self.model_info = ModelInfo(
            id=self._model.name,
            context_length=self._llm.n_ctx(),
            chat_template=self._llm.metadata.get("tokenizer.chat_template"),
            bos_token=self.tokenizer.token_text(self._llm.token_bos()),
            eos_token=self.tokenizer.token_text(self._llm.token_eos()),
        )
        self._thread = threading.Thread(target=self._worker, name="llama-cpp-engine", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join(timeout=30)
            self._thread = None
        if self._llm is not None:
            self._llm.close()
            self._llm = None

    # ---- requests -----------------------------------------------------------------------

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationOutput]:
        if self._thread is None:
            raise EngineError("engine is not running")
        stream = OutputStream()
        with self._lock:
            self._active.add(request.request_id)
        self._jobs.put(_Job(request, stream))
        finished = False
        try:
            while not finished:
                output = await stream.get()
                finished = output.finished
                yield output
        finally:
            if not finished:
                self.abort(request.request_id)

    def abort(self, request_id: str) -> None:
        with self._lock:
            if request_id in self._active:
                self._aborted.add(request_id)

    def _is_aborted(self, request_id: str) -> bool:
        with self._lock:
            return request_id in self._aborted

    def _release(self, request_id: str) -> None:
        with self._lock:
            self._active.discard(request_id)
            self._aborted.discard(request_id)

    # ---- worker thread ------------------------------------------------------------------

    def _worker(self) -> None:
        while (job := self._jobs.get()) is not None:
            request_id = job.request.request_id
            try:
                self._run(job)
            except Exception as exc:  # one request fails; the engine keeps serving
                log.exception("request %s failed", request_id)
                job.stream.put(
                    GenerationOutput(request_id, finish_reason="error", error=f"{type(exc).__name__}: {exc}")
                )
            finally:
                self._release(request_id)

    def _cached_prefix(self, prompt: list[int]) -> int:
        llm = self._llm
        n = 0
        for a, b in zip(llm._input_ids[: llm.n_tokens], prompt):
            if a != b:
                break
            n += 1
        return min(n, len(prompt) - 1)  # the last prompt token is always decoded again

    def _run(self, job: _Job) -> None:
        req, stream, llm = job.request, job.stream, self._llm
        rid, sp = req.request_id, req.sampling
        n_prompt = len(req.prompt_token_ids)
        if self._is_aborted(rid):
            log.info("request %s aborted before it started", rid)
            stream.put(GenerationOutput(rid, finish_reason="abort", num_prompt_tokens=n_prompt))
            return
        cached = self._cached_prefix(req.prompt_token_ids)
        llm.set_seed(_llama_seed(sp.seed))
        decoder = IncrementalDecoder()
        tokens = llm.generate(
            req.prompt_token_ids,
            top_k=sp.top_k,
            top_p=sp.top_p,
            min_p=sp.min_p,
            typical_p=1.0,
            temp=sp.temperature,
            repeat_penalty=sp.repetition_penalty,
            frequency_penalty=sp.frequency_penalty,
            presence_penalty=sp.presence_penalty,
        )
        n_generated = 0
        try:
            for token in tokens:
                n_generated += 1
                out = GenerationOutput(rid, [token], num_prompt_tokens=n_prompt, num_cached_tokens=cached)
                if self._is_aborted(rid):
                    out.token_ids, out.finish_reason = [], "abort"
                    log.info("request %s aborted after %d tokens", rid, n_generated - 1)
                elif not sp.ignore_eos and (token in sp.stop_token_ids or self.tokenizer.is_eog(token)):
                    out.text, out.finish_reason = decoder.flush(), "stop"
                else:
                    out.text = decoder.feed(self.tokenizer.piece(token))
                    if n_generated >= sp.max_tokens:
                        out.text += decoder.flush()
                        out.finish_reason = "length"
                stream.put(out)
                if out.finished:
                    return
        finally:
            tokens.close()
