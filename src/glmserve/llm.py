"""In-process Python API: the same serving layer as the HTTP server, without HTTP.

    from glmserve import LLM
    llm = LLM()                                          # embedded default model
    reply = llm.chat([{"role": "user", "content": "Hi"}], max_tokens=64)
    for chunk in llm.chat(messages, stream=True): ...
    reply = await llm.achat(messages)                    # asyncio apps

Requests and responses are the HTTP API's own pydantic types (``glmserve.protocol.chat``:
``ChatCompletion``, ``ChatCompletionChunk``), field for field what ``/v1/chat/completions``
returns. Client errors raise ``glmserve.protocol.errors.APIError`` (with ``status_code``);
a request that does not validate raises ``pydantic.ValidationError``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

from glmserve.protocol.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionRequest
from glmserve.protocol.errors import APIError, ErrorResponse, model_not_found
from glmserve.runtime.start import start_model
from glmserve.serving.generation.chunks import StreamItem
from glmserve.settings.model import ModelSettings
from glmserve.settings.serve import ServeSettings


class LLM:
    """A model served in-process. ``LLM(model=None, engine="llama_cpp", **settings)``: the
    keyword settings are ``glmserve serve``'s model settings (``n_ctx``, ``n_threads``,
    ``max_num_seqs`` ...). Raises ``TypeError`` for any other keyword (a server's setting such
    as ``port``, or a misspelt one), and what start-up raises (``EngineError``,
    ``ModelNotFoundError``) when the model cannot be loaded. ``close()`` (or ``with LLM() as
    llm:``) frees it."""

    def __init__(self, model: str | None = None, engine: str = "llama_cpp", **settings: Any) -> None:
        unknown = sorted(set(settings) - set(ModelSettings.model_fields))
        if unknown:
            server = set(ServeSettings.model_fields)
            raise TypeError(f"LLM() does not take {', '.join(unknown)}: "
                            + ("a server's settings; LLM runs a model in this process" if server.issuperset(unknown)
                               else "not a model setting of glmserve serve"))
        self._runtime = start_model(ServeSettings(model=model, engine=engine, **settings))
        self.model = self._runtime.pipeline.name
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="glmserve-llm", daemon=True)
        self._thread.start()

    # ---- async ---------------------------------------------------------------------------

    def _request(self, messages: list[dict], stream: bool, params: dict[str, Any]) -> ChatCompletionRequest:
        """The chat request; a ``model`` in ``params`` must name this model, an alias or one of its
        LoRA adapters (``APIError`` 404 otherwise), as the server's router checks it."""
        pipeline = self._runtime.pipeline
        model = params.get("model", self.model)
        if model != pipeline.name and model not in pipeline.aliases and model not in pipeline.adapters:
            raise model_not_found(model)
        body = {"model": self.model, **params, "messages": messages, "stream": stream}
        if stream:
            body.setdefault("stream_options", {"include_usage": True})
        return ChatCompletionRequest.model_validate(body)

    async def achat(self, messages: list[dict], *, stream: bool = False,
                    **params: Any) -> ChatCompletion | AsyncIterator[ChatCompletionChunk]:
        """``ChatCompletion``, or with ``stream=True`` an async iterator of chunks (the last
        carries ``usage``). ``params`` are the request's other fields (``max_tokens``,
        ``temperature``, ``stop``, ``seed`` ...)."""
        result = await self._runtime.chat.create(self._request(messages, stream, params))
        if isinstance(result, ChatCompletion):
            return result
        return self._chunks(result)

    async def _chunks(self, items: AsyncIterator[StreamItem]) -> AsyncIterator[ChatCompletionChunk]:
        try:
            async for item in items:
                if isinstance(item, ErrorResponse):
                    e = item.error
                    raise APIError(500, e.message, e.type, e.param, e.code)
                yield item
        finally:
            await items.aclose()  # leaving early aborts the generation

    # ---- sync ----------------------------------------------------------------------------

    def _run(self, coro):
        """``coro`` run on the engine's loop, its result waited for here. Interrupted while
        waiting (Ctrl-C), the coroutine is cancelled there and waited for (30 s at most) until it
        has wound down, then the interrupt goes on: the caller's next step (closing the stream it
        was reading, whose ``anext`` this was) must not meet it still running. Cancelling the
        concurrent future alone returns at once, while the task is still being cancelled."""
        started: list[asyncio.Task] = []

        async def tracked():
            started.append(asyncio.current_task())
            return await coro

        future = asyncio.run_coroutine_threadsafe(tracked(), self._loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # cancels the task on the loop (a callback queued there)

            async def settle() -> None:  # runs after that callback: the task is cancelled or done
                if started:
                    await asyncio.wait(started)
                else:
                    coro.close()  # never started, and now never will

            try:
                asyncio.run_coroutine_threadsafe(settle(), self._loop).result(timeout=30)
            except (concurrent.futures.TimeoutError, RuntimeError):
                pass
            raise

    def chat(self, messages: list[dict], *, stream: bool = False,
             **params: Any) -> ChatCompletion | Iterator[ChatCompletionChunk]:
        """Blocking ``achat``; with ``stream=True`` a plain iterator of chunks (closing it early
        aborts the generation)."""
        if not stream:
            return self._run(self.achat(messages, **params))
        chunks = self._run(self.achat(messages, stream=True, **params))
        return self._iterate(chunks)

    def _iterate(self, chunks: AsyncIterator[ChatCompletionChunk]) -> Iterator[ChatCompletionChunk]:
        try:
            while True:
                try:
                    yield self._run(anext(chunks))
                except StopAsyncIteration:
                    return
        finally:
            self._run(chunks.aclose())

    # ---- lifecycle -----------------------------------------------------------------------

    def close(self) -> None:
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        self._runtime.shutdown()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
