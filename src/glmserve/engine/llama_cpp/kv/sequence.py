"""What the continuous-batching scheduler (``engine/llama_cpp/kv/scheduler.py``) and the llama.cpp engine
share: a request inside the engine (``Sequence``), a KV-cache slot, and one step's plan (the
chunks to decode, the KV operations to apply first). No llama.cpp or torch imports."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Literal

from glmserve.engine.llama_cpp.kv.prompt_cache import CachedPrompt


class SeqStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True, frozen=True, eq=False)
class MediaSpan:
    """An image in a prompt: tokens ``[start, start + n_tokens)`` of its sequence, each its
    ``prompt_cache.media_token`` (negative; never decoded as tokens: the engine decodes the image's embeddings at once,
    ``chunk``), which take ``n_pos`` positions (fewer than ``n_tokens`` under multimodal RoPE,
    GLM-4V's: the image's rows and columns share positions)."""

    start: int
    n_tokens: int
    n_pos: int
    chunk: Any

    @property
    def end(self) -> int:
        return self.start + self.n_tokens


@dataclass(slots=True, eq=False)
class Sequence:
    """One request inside the engine. ``tokens`` = prompt then generated tokens;
    ``num_computed`` of them are in the KV cache. ``payload`` is the engine's own state.
    ``media``: the prompt's images, in order (their tokens are ``media_token``s; a chunk never
    ends inside one, ``whole``), so a token's KV position is ``position(index)``."""

    request_id: str
    tokens: list[int]
    payload: Any = None
    num_prompt: int = 0
    num_computed: int = 0
    num_cached: int = -1  # prompt tokens reused from the cache, set at first admission
    slot: int = -1
    status: SeqStatus = SeqStatus.WAITING
    group: str | None = None  # LoRA adapter name; None: the base model
    salt: str | None = None  # its KV is reused only for sequences of the same salt (GenerationRequest.cache_salt)
    tenant: str | None = None  # whose turn it is (GenerationRequest.tenant; engine/admission.py)
    priority: int = 0  # lower first (GenerationRequest.priority)
    media: tuple[MediaSpan, ...] = ()

    def __post_init__(self) -> None:
        if not self.tokens:
            raise ValueError("a sequence needs at least one token")
        self.num_prompt = self.num_prompt or len(self.tokens)
        if any(self.tokens[span.start] >= 0 for span in self.media):
            raise ValueError("an image's tokens must be its media_token")

    def position(self, index: int) -> int:
        """The KV position of token ``index`` (outside an image): its index, less the tokens the
        images before it take beyond their positions."""
        return index - sum(span.n_tokens - span.n_pos for span in self.media if span.end <= index)

    def whole(self, start: int, n: int) -> int:
        """``n`` tokens from ``start``, or more, so that they do not end inside an image."""
        end = start + n
        for span in self.media:
            if span.start < end < span.end:
                return span.end - start
        return n

    @property
    def num_generated(self) -> int:
        return len(self.tokens) - self.num_prompt


@dataclass(slots=True, eq=False)
class Slot:
    """A llama.cpp sequence id: ``tokens[:n_kv]`` are in the KV cache under this id."""

    id: int
    tokens: list[int] = field(default_factory=list)
    n_kv: int = 0
    seq: Sequence | None = None
    last_used: int = 0
    group: str | None = None  # the group whose KV the cells hold
    salt: str | None = None  # the cache salt of the sequence that computed them


@dataclass(slots=True, frozen=True)
class KVOp:
    """``rm``: drop ``slot``'s cells at positions >= ``p0``. ``cp``: make positions
    ``[0, p1)`` of ``src`` visible to ``slot`` too (``p1`` -1: all of them, replacing what
    ``slot`` held; the split layout copies whole streams). ``save``: keep ``slot``'s state (its
    cells, positions ``[0, p1)``: ``tokens``, computed under ``group``) in the host prompt
    cache. ``load``: replace ``slot``'s cells with ``entry``'s state from the host cache."""

    kind: Literal["rm", "cp", "save", "load"]
    slot: int
    p0: int = 0
    p1: int = -1
    src: int = -1
    tokens: tuple[int, ...] = ()
    group: str | None = None
    salt: str | None = None
    entry: CachedPrompt | None = None


@dataclass(slots=True)
class Chunk:
    """Decode ``seq.tokens[start:start + length]`` at positions ``start...`` in ``seq.slot``;
    ``sample``: the chunk ends the known tokens, so sample the next one from its last logits."""

    seq: Sequence
    start: int
    length: int
    sample: bool


@dataclass(slots=True)
class SchedulerOutput:
    chunks: list[Chunk] = field(default_factory=list)
    kv_ops: list[KVOp] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    group: str | None = None  # every chunk belongs to this group (LoRA adapter)

    @property
    def num_tokens(self) -> int:
        return sum(c.length for c in self.chunks)
