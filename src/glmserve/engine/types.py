"""Engine-neutral request/response types shared by every engine and the serving layer.

Hot-path state, so plain ``@dataclass(slots=True)`` with checks in ``__post_init__`` (the
nano-vllm style), not pydantic.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

FinishReason = Literal["stop", "length", "abort", "error"]
MAX_LOGPROBS = 20  # alternatives per token (OpenAI's top_logprobs bound)


@dataclass(slots=True, frozen=True)
class TokenLogprob:
    """A generated token's log-probability under the model's raw output (log-softmax of the
    logits, before temperature, penalties or any other sampling adjustment, as vLLM's default
    ``raw_logprobs``), and the ``top`` most likely tokens as (token id, log-probability), most
    likely first."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(slots=True)
class SamplingParams:
    """How to pick each next token.

    ``temperature == 0`` means greedy decoding. ``top_k <= 0`` and ``top_p == 1`` / ``min_p == 0``
    disable those filters. ``repetition_penalty`` is multiplicative (1.0 = off, llama.cpp's
    ``repeat_penalty``); ``presence_penalty`` / ``frequency_penalty`` are OpenAI's additive
    penalties. ``seed`` None means a fresh random seed per request. ``logit_bias`` maps token
    ids to values added to their logits (OpenAI's -100..100; -100 bans a token). ``grammar``
    (GBNF) restricts every token to those that keep the output inside the grammar.
    ``max_tokens`` is the number of tokens to generate at most (already resolved against the
    context window by the serving layer). ``stop_token_ids`` end generation with
    ``finish_reason="stop"`` (the token itself is not returned as text) unless ``ignore_eos``.
    """

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    logit_bias: dict[int, float] | None = None
    grammar: str | None = None  # GBNF (llama.cpp grammar format), root rule "root"
    logprobs: int | None = None  # None: none; k: each token's log-probability and the k most likely

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if not 0 <= self.min_p <= 1:
            raise ValueError("min_p must be in [0, 1]")
        if self.repetition_penalty <= 0:
            raise ValueError("repetition_penalty must be > 0")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise ValueError(f"logprobs must be in [0, {MAX_LOGPROBS}]")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(slots=True)
class GenerationRequest:
    """One sequence to generate: prompt token ids (already rendered and tokenized) + sampling.

    ``lora``: the name of the LoRA adapter to generate with (None: the base model).
    ``multimodal``: extra model inputs for the prompt's images, as the engine's own
    ``multimodal.process`` made them (opaque to the serving layer).
    ``priority``: vLLM's meaning, lower first: 0 for interactive requests, ``BATCH_PRIORITY``
    for batch work; the llama_cpp engine pauses and, for a slot, preempts sequences of a
    higher value while one of a lower value has work (``engine/llama_cpp/kv/scheduler.py``).
    ``cache_salt``: prefix caching reuses only KV computed for requests of the same salt (vLLM's
    ``cache_salt``): the serving layer sets it per API key when there are several, so that one
    key's ``cached_tokens`` says nothing of another's prompts (None: shared with other None).
    ``tenant``: whose turn the request is (the API key's owner digest on a server of several
    keys, else None): admission and the engines' queues share places and slots across tenants
    (``engine/admission.py``).
    ``shown_special_ids``: special tokens whose text the engine's detokenizer writes into
    ``GenerationOutput.text`` (every other special token gives none): the reasoning and tool-call
    tags the serving layer parses, where the vocabulary marks them special (a GGUF may make
    ``</think>`` a control token; vLLM's parsers match such tags by token id).
    ``token_by_token``: the request's outputs come one per token, never merged by the step
    engines' ``--stream-interval-ms`` (``engine/stream.py``): the serving layer sets it where it
    ends a reply at a stop string, so that usage counts the tokens up to the one the stop string
    ended in, whatever the timing."""

    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    lora: str | None = None
    multimodal: Any = None
    priority: int = 0
    shown_special_ids: frozenset[int] = frozenset()
    cache_salt: str | None = None
    tenant: str | None = None
    token_by_token: bool = False

    def __post_init__(self) -> None:
        if not self.prompt_token_ids:
            raise ValueError("prompt_token_ids must not be empty")


INTERACTIVE_PRIORITY = 0  # the priority of a request an API route serves
BATCH_PRIORITY = 1  # the priority of batch lines (/v1/batches, /v1/messages/batches)


@dataclass(slots=True)
class GenerationOutput:
    """One step of one request's output, as the engine streams it.

    ``token_ids``: tokens produced since the previous output (usually one).
    ``text``: their detokenized text (UTF-8 safe: a character split across tokens is emitted
    once complete; special tokens produce no text).
    ``finish_reason``: set on the last output of the request; ``error`` carries a message then,
    and ``invalid`` says the engine refused the request's input (a 400 for the client: vLLM's
    own checks of a multimodal prompt, say), not failed on it (a 500).
    ``num_prompt_tokens`` / ``num_cached_tokens``: prompt size as the engine ran it (image
    placeholders expanded, where the engine expands them) and how much of it was reused from
    the KV cache (prefix reuse). ``logprobs``: per token, when ``SamplingParams.logprobs`` is set.
    """

    request_id: str
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: FinishReason | None = None
    error: str | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    logprobs: list[TokenLogprob] | None = None  # one per token_ids entry, when the request asked
    invalid: bool = False

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True, frozen=True)
class EngineStats:
    """A snapshot of an engine's load: requests ``running`` (at most ``max_num_seqs``) and
    ``waiting`` (admitted, queued), and the share of the KV cache in use (0..1, idle prefix
    caches included; None when the engine does not know it). ``spec_decode``: speculative
    decoding's (drafts, draft tokens, accepted tokens) since start; None without speculation.
    ``prompt_cache_ram``: the host-memory prompt cache's (bytes held, entries, restores since
    start); None without one."""

    running: int
    waiting: int
    kv_cache_usage: float | None = None
    spec_decode: tuple[int, int, int] | None = None
    prompt_cache_ram: tuple[int, int, int] | None = None


@dataclass(slots=True)
class SpecDecodeCounters:
    """vLLM's spec-decode counters (``vllm:spec_decode_num_drafts`` and the rest): drafts
    verified, tokens drafted, drafted tokens accepted; ``as_stats()`` is ``EngineStats.spec_decode``."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0

    def add(self, drafted: int, accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += drafted
        self.num_accepted_tokens += accepted

    @property
    def acceptance_rate(self) -> float | None:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else None

    def as_stats(self) -> tuple[int, int, int]:
        return self.num_drafts, self.num_draft_tokens, self.num_accepted_tokens

    def describe(self) -> str:
        rate = self.acceptance_rate
        return (f"{self.num_drafts} drafts, {self.num_draft_tokens} draft tokens, {self.num_accepted_tokens} "
                f"accepted" + ("" if rate is None else f" (acceptance rate {rate:.1%})"))


@dataclass(slots=True, frozen=True)
class ModelInfo:
    """What an engine serves: the model's id, its context length (tokens) and capabilities.

    ``vision``: the engine takes images (it then has a ``multimodal`` processor);
    ``lora_adapters``: names of the LoRA adapters a request may pick by ``model``;
    ``grammar``: it can constrain sampling with a GBNF grammar; ``max_num_seqs``,
    ``max_num_batched_tokens`` (None: the engine has no such limit) and ``max_queue``: the batch
    and admission limits in force (the flags, or the engine's defaults); ``embedding_size``: the
    length of the vectors ``Engine.embed`` returns (the model's hidden size), None when the
    engine cannot embed; ``generation``: it generates text (False: an embedding model served
    without a generation context, whose ``generate`` raises ``EngineError``); ``backend``
    (llama.cpp's: CPU, CUDA, Metal, Vulkan...), ``n_gpu_layers`` (layers offloaded, 0 on the
    CPU) and ``devices`` (llama.cpp's devices, the ``--rpc`` ones among them): where the model
    runs, None where the engine does not say."""

    id: str
    context_length: int
    chat_template: str | None
    bos_token: str
    eos_token: str
    vision: bool = False
    lora_adapters: tuple[str, ...] = ()
    grammar: bool = False
    owned_by: str = "glmserve"
    max_num_seqs: int = 1
    max_num_batched_tokens: int | None = None
    max_queue: int = 0
    embedding_size: int | None = None
    generation: bool = True
    backend: str | None = None
    n_gpu_layers: int | None = None
    devices: tuple[str, ...] | None = None

    def with_lora_adapters(self, names: tuple[str, ...]) -> ModelInfo:
        """A copy listing ``names`` as the LoRA adapters (an engine swaps its ``model_info``
        when adapters load or unload at run time)."""
        return dataclasses.replace(self, lora_adapters=names)
