"""A fake engine and tokenizer for testing the serving and HTTP layers without a model.

The tokenizer maps each character to its code point and a few ChatML markers to ids >= 1000;
the engine replays a scripted reply (or fails on cue), through the real ``Engine`` protocol.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from glmserve.engine.base import EngineError, LoRAAdapterError
from glmserve.engine.types import EngineStats, GenerationOutput, GenerationRequest, ModelInfo

SPECIAL = {"<|im_start|>": 1000, "<|im_end|>": 1001, "[gMASK]": 1002, "<sop>": 1003, "<|system|>": 1004,
           "<|user|>": 1005, "<|assistant|>": 1006, "<|observation|>": 1007}


class FakeTokenizer:
    n_vocab = 1100

    def encode(self, text: str) -> list[int]:
        ids, i = [], 0
        while i < len(text):
            for tok, tid in SPECIAL.items():
                if text.startswith(tok, i):
                    ids.append(tid)
                    i += len(tok)
                    break
            else:
                ids.append(ord(text[i]))
                i += 1
        return ids

    def encode_prompt(self, text: str) -> list[int]:
        return self.encode(text)

    def is_special(self, token_id: int) -> bool:
        return token_id in SPECIAL.values()

    def special_texts(self) -> frozenset[str]:
        return frozenset(SPECIAL)

    def encode_plain(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, token_ids: list[int]) -> str:
        names = {v: k for k, v in SPECIAL.items()}
        return "".join(names.get(t) or chr(t) for t in token_ids)


class FakeEngine:
    """Replies with ``reply`` (or ``reply(prompt text)``) one character per output; fails after
    ``fail_after`` outputs when the prompt contains ``FAIL`` (as an error output) or ``CRASH``
    (as an exception)."""

    def __init__(self, reply: str | Callable[[str], str] = "Hello there", context_length: int = 256,
                 fail_after: int = 3, grammar: bool = False, embedding_size: int | None = None,
                 lora_adapters: tuple[str, ...] = ()) -> None:
        self.reply = reply
        self.fail_after = fail_after
        self.tokenizer = FakeTokenizer()
        self.multimodal = None
        self.model_info = ModelInfo(id="fake", context_length=context_length, chat_template=None,
                                    bos_token="", eos_token="", grammar=grammar, embedding_size=embedding_size,
                                    lora_adapters=lora_adapters)
        self.aborted: list[str] = []
        self.requests: list[GenerationRequest] = []
        self.broken = False  # check_health fails, as when an engine's worker died
        self.lora_log: list[tuple[str, str]] = []  # ("load" | "unload", adapter name), in order

    def prompt_text(self, request: GenerationRequest) -> str:
        names = {v: k for k, v in SPECIAL.items()}
        return "".join(names.get(t, chr(t)) if t >= 1000 else chr(t) for t in request.prompt_token_ids)

    def start(self) -> None: ...

    def shutdown(self) -> None: ...

    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    def stats(self) -> EngineStats:
        return EngineStats(0, 0)

    def check_health(self) -> None:
        if self.broken:
            raise EngineError("the engine's worker thread is not running")

    async def embed(self, token_ids: list[int]) -> list[float]:
        """[count, sum] of the ids, then zeros; raises ``RuntimeError`` for ids holding "!"."""
        if self.model_info.embedding_size is None:
            raise EngineError("no embeddings")
        if ord("!") in token_ids:
            raise RuntimeError("llama_decode failed")
        return [float(len(token_ids)), float(sum(token_ids))] + [0.0] * (self.model_info.embedding_size - 2)

    async def load_lora_adapter(self, name: str, path: str) -> None:
        """Any path but one ending in "misfit" loads."""
        if path.endswith("misfit"):
            raise LoRAAdapterError(f"LoRA adapter {name!r} ({path}) does not match the base model")
        self.lora_log.append(("load", name))
        self.model_info = self.model_info.with_lora_adapters((*self.model_info.lora_adapters, name))

    async def unload_lora_adapter(self, name: str) -> None:
        self.lora_log.append(("unload", name))
        self.model_info = self.model_info.with_lora_adapters(
            tuple(a for a in self.model_info.lora_adapters if a != name))

    def generate(self, request: GenerationRequest, loop=None) -> AsyncIterator[GenerationOutput]:
        if request.lora is not None and request.lora not in self.model_info.lora_adapters:
            raise LoRAAdapterError(f"LoRA adapter {request.lora!r} is not loaded")  # as the engines refuse it
        self.requests.append(request)
        return self._generate(request)

    async def _generate(self, request: GenerationRequest) -> AsyncIterator[GenerationOutput]:
        prompt = self.prompt_text(request)
        n = len(request.prompt_token_ids)
        finished = False
        try:
            async for out in self._outputs(request, prompt, n):
                finished = out.finished
                yield out
        finally:
            if not finished:  # the consumer left early: the protocol says that aborts
                self.abort(request.request_id)

    async def _outputs(self, request: GenerationRequest, prompt: str, n: int) -> AsyncIterator[GenerationOutput]:
        reply = self.reply(prompt) if callable(self.reply) else self.reply
        for i, ch in enumerate(reply[: request.sampling.max_tokens]):
            await asyncio.sleep(0)
            if i == self.fail_after and "FAIL" in prompt:
                yield GenerationOutput(request.request_id, finish_reason="error", error="decode failed",
                                       num_prompt_tokens=n)
                return
            if i == self.fail_after and "CRASH" in prompt:
                raise RuntimeError("engine crashed")
            last = i == min(len(reply), request.sampling.max_tokens) - 1
            reason = None if not last else ("length" if request.sampling.max_tokens <= len(reply) else "stop")
            yield GenerationOutput(request.request_id, [ord(ch)], ch, reason, num_prompt_tokens=n)


def one_model(model, seal=None):
    """The ``ModelRouter`` of one started model, for ``create_app``: ``model`` a ``ModelPipeline``
    or a ``ChatService`` over one (its services are built as ``runtime/start.py`` builds them,
    ``LoadedModel.over``); ``seal``: the Responses API's ``ReasoningSeal``."""
    from glmserve.runtime.loaded import LoadedModel
    from glmserve.runtime.router import ModelRouter

    pipeline = getattr(model, "pipeline", model)
    return ModelRouter.single(LoadedModel.over(pipeline, seal=seal))
