"""Request rules every engine applies, kept once: whether an engine takes a request, which
tokens end it, when a generated token ends it, and how its text tells a tag token from the same
characters written by other tokens (``TagEscaper``, ``unescape_tags``)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from glmserve.engine.base import EngineError
from glmserve.engine.types import FinishReason, GenerationRequest, ModelInfo, SamplingParams


def check_request(request: GenerationRequest, info: ModelInfo) -> None:
    """Raise ``EngineError`` when the prompt leaves no room to generate in
    ``info.context_length`` tokens, or when ``request.lora`` names no loaded adapter."""
    n_prompt = len(request.prompt_token_ids)
    if n_prompt >= info.context_length:
        raise EngineError(f"prompt of {n_prompt} tokens does not fit the context of {info.context_length}")
    if request.lora is not None and request.lora not in info.lora_adapters:
        raise EngineError(f"unknown LoRA adapter {request.lora!r}")


def stop_token_ids(sampling: SamplingParams, eog_ids: frozenset[int]) -> frozenset[int]:
    """Token ids that end generation: the model's end-of-generation ids plus the request's
    ``stop_token_ids``, or none with ``ignore_eos``."""
    return frozenset() if sampling.ignore_eos else eog_ids | frozenset(sampling.stop_token_ids)


def finish_reason(token: int, stop_ids: frozenset[int], num_generated: int, num_tokens: int,
                  max_tokens: int, context_length: int) -> FinishReason | None:
    """Why generation ends at ``token`` (the ``num_generated``-th generated token; the sequence
    now holds ``num_tokens`` tokens, prompt included): "stop" for a stop token, "length" at
    ``max_tokens`` or a full context, else None."""
    if token in stop_ids:
        return "stop"
    if num_generated >= max_tokens or num_tokens >= context_length:
        return "length"
    return None


TAG_BREAK = "\ue000"  # a private-use character: written after a tag's first character, or doubled
_UNESCAPE = re.compile(TAG_BREAK + "(" + TAG_BREAK + "?)")


class TagEscaper:
    """The text of one sequence with its tags told apart by token: where a tag (``<think>``,
    ``</arg_value>``...: the text of a ``GenerationRequest.shown_special_ids`` token) comes from
    its token, it is written as is; where other tokens spell the same characters, ``TAG_BREAK``
    is written after its first character (``<`` U+E000 ``/arg_value>``), so that the parsers,
    which match tags in the text, read it as text; a ``TAG_BREAK`` the model writes itself is
    doubled. ``unescape_tags`` gives back what the model wrote. The same end as vLLM's GLM
    parsers, which match these tags by token id, with parsers that read text.

    ``feed(text, tag)``: the next decoded text (``tag``: it is a tag token's own text); returns
    the escaped text that is certain, holding back a tail that may be the start of a tag spelled
    by the next tokens. ``flush()``: what is held back, at the end."""

    __slots__ = ("_tags", "_starts", "_held")

    def __init__(self, tags: Iterable[str]) -> None:
        self._tags = tuple(sorted({t for t in tags if t}, key=len, reverse=True))
        self._starts = frozenset(t[0] for t in self._tags)
        self._held = ""

    def feed(self, text: str, tag: bool = False) -> str:
        if tag:
            return self.flush() + text
        if TAG_BREAK in text:
            text = text.replace(TAG_BREAK, TAG_BREAK * 2)
        text = self._held + text
        if not any(c in text for c in self._starts):
            self._held = ""
            return text
        for t in self._tags:
            if t in text:
                text = text.replace(t, t[0] + TAG_BREAK + t[1:])
        keep = max((n for t in self._tags for n in range(min(len(t) - 1, len(text)), 0, -1)
                    if text.endswith(t[:n])), default=0)
        self._held = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep]

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held


def tag_escaper(tags: Iterable[str]) -> TagEscaper | None:
    """A ``TagEscaper`` for ``tags``, or None when there are none (the text is then the model's as
    is, and ``unescape_tags`` leaves it so)."""
    tags = [t for t in tags if t]
    return TagEscaper(tags) if tags else None


def escaped_tags(request: GenerationRequest) -> frozenset[int]:
    """The tag tokens of ``request`` whose look-alikes its text escapes (``TagEscaper``): its
    ``shown_special_ids``, but none under a grammar, whose tags are where the grammar puts them
    (a grammar matches text: it may write a tag with ordinary tokens)."""
    return request.shown_special_ids if request.sampling.grammar is None else frozenset()


def sequence_text(token_ids: list[int], decode: Callable[[list[int]], str], tags: dict[int, str]) -> str:
    """The whole text of a sequence's ``token_ids`` as an engine writes it for a request whose
    escaped tags are ``tags`` (id -> text, of ``escaped_tags``): each tag token's own text, the
    ordinary tokens between them decoded (``decode``) and their tags' look-alikes escaped
    (``TagEscaper``), nothing held back. Without ``tags``, ``decode(token_ids)``."""
    if not tags:
        return decode(token_ids)
    escaper, pieces, run = TagEscaper(tags.values()), [], []
    for token_id in token_ids:
        if token_id in tags:
            pieces += [escaper.feed(decode(run)) if run else "", escaper.feed(tags[token_id], tag=True)]
            run = []
        else:
            run.append(token_id)
    pieces += [escaper.feed(decode(run)) if run else "", escaper.flush()]
    return "".join(pieces)


def unescape_tags(text: str) -> str:
    """``TagEscaper``'s text as the model wrote it: each ``TAG_BREAK`` dropped, a doubled one
    written once."""
    return _UNESCAPE.sub(r"\1", text) if TAG_BREAK in text else text


def model_text(request: GenerationRequest, text: str) -> str:
    """Text of ``request``'s output (or parsed from it) as the model wrote it: unescaped where
    the engine escaped it (``escaped_tags``), else as it is (a ``TAG_BREAK`` the model wrote
    then stands for itself)."""
    return unescape_tags(text) if escaped_tags(request) else text
