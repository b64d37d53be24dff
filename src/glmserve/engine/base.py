"""The ``Engine`` protocol that every engine (llama_cpp, transformers, vllm) implements."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, Protocol, runtime_checkable

from glmserve.engine.types import EngineStats, GenerationOutput, GenerationRequest, ModelInfo


@runtime_checkable
class Tokenizer(Protocol):
    """The model's tokenizer, as the serving layer needs it. ``n_vocab``: the number of token
    ids (valid ids are ``0 .. n_vocab - 1``)."""

    n_vocab: int

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, special-token markup parsed as special tokens, no BOS added."""

    def encode_prompt(self, text: str) -> list[int]:
        """Token ids of a rendered chat prompt: like ``encode``, plus the model's BOS token
        when the model asks for one and the text does not already start with it."""

    def is_special(self, token_id: int) -> bool:
        """True for control tokens (role markers, end-of-turn, BOS/EOS), which produce no text."""

    def special_texts(self) -> frozenset[str]:
        """The texts of the special (control) tokens, which ``encode`` reads as those tokens
        (``<|user|>``, ``<|im_end|>``...)."""

    def encode_plain(self, text: str) -> list[int]:
        """Token ids of ``text`` with no special-token markup parsed: ``<|user|>`` as the
        ordinary tokens that spell it (llama.cpp's ``parse_special`` false)."""

    def decode(self, token_ids: list[int]) -> str:
        """The text of ``token_ids`` (each in ``0 .. n_vocab - 1``), special tokens written out;
        bytes that are not UTF-8 become U+FFFD."""


def one_line(exc: BaseException, limit: int = 400) -> str:
    """``exc``'s message on one line, at most ``limit`` characters (its type name when empty),
    for start-up errors and failed requests."""
    return " ".join(str(exc).split())[:limit] or type(exc).__name__


class EngineError(RuntimeError):
    """A failure inside the engine (model load, decode). Start-up turns it into a one-line exit."""


class GrammarError(EngineError):
    """The request's grammar cannot be compiled (a 400 for the client)."""


class LoRAAdapterError(EngineError):
    """A LoRA adapter cannot be loaded at run time: no such file, or it does not fit the base
    model (a 400 for the client)."""


class EngineOverloaded(EngineError):
    """Raised by ``generate`` when ``max_num_seqs`` are running and ``max_queue`` are waiting;
    the server answers 429 with ``Retry-After: retry_after_s``."""

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Engine(Protocol):
    """A request-based generation engine.

    Lifecycle: ``start()`` once (loads the model; raises ``EngineError``), then any number of
    concurrent ``generate`` calls, then ``shutdown()``. Generation runs on the engine's own
    thread(s), never on the event loop.
    """

    model_info: ModelInfo
    tokenizer: Tokenizer
    multimodal: Any  # the image processor when ``model_info.vision`` (``serving.prompt.MultimodalProcessor``), else None

    def start(self) -> None: ...

    def generate(self, request: GenerationRequest,
                 loop: asyncio.AbstractEventLoop | None = None) -> AsyncIterator[GenerationOutput]:
        """Admit ``request`` now (raises ``EngineOverloaded`` when full, ``GrammarError`` when
        its grammar does not compile) and return the stream of its outputs; the last has
        ``finish_reason`` set. Closing the stream (``aclose``) before the end aborts the request,
        also if it was never iterated. ``loop``: the event loop that consumes the stream
        (default: the running one); thread-safe, so a costly admission (compiling a grammar)
        can run on a worker thread."""

    async def embed(self, token_ids: list[int]) -> list[float]:
        """The embedding of one input: the mean over its tokens of the model's last hidden
        state (after the final norm, no LoRA adapter), L2-normalised; ``model_info.embedding_size``
        floats. ``token_ids``: 1 to ``context_length`` ids of this model. Runs on the engine's
        own thread, between generation steps. Raises ``EngineError`` when the engine cannot
        embed (``embedding_size`` is None) or is not running."""

    async def load_lora_adapter(self, name: str, path: str) -> None:
        """Load the LoRA adapter at ``path`` (the engine's adapter format: a GGUF file on llama_cpp,
        a PEFT folder on transformers) as ``name``; requests then pick it by ``model`` and
        ``model_info.lora_adapters`` lists it. ``name`` is new (the serving layer checks).
        Raises ``LoRAAdapterError`` (missing, or does not fit the model) or ``EngineError``
        (this engine does not load adapters at run time)."""

    async def unload_lora_adapter(self, name: str) -> None:
        """Unload the adapter ``name`` (one of ``model_info.lora_adapters``): new requests for it
        are refused at once; requests still on it end with an error (llama_cpp, transformers) or
        are waited for (vllm, whose requests cannot be ended between steps); returns once it is
        freed. The serving layer calls this only after the adapter's last request ended
        (``serving/adapters.py``), so no answer is cut by it there."""

    def abort(self, request_id: str) -> None:
        """Stop ``request_id`` at the next step; its stream ends with ``finish_reason="abort"``."""

    def stats(self) -> EngineStats:
        """The engine's load now (any thread; for ``/metrics``)."""

    def check_health(self) -> None:
        """Raise ``EngineError`` when the engine can no longer serve: its worker thread or
        engine core has died (any thread; Ray Serve's replica health check)."""

    def shutdown(self) -> None: ...
