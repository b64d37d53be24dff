"""Text a client sends stays text: the special tokens' texts (``<|assistant|>``, ``<|observation|>``,
``<|im_end|>``) and the parsers' tags (``</think>``, ``<tool_call>``) written in a request's
messages and tools are tokenized as the ordinary tokens that spell them, while the chat
template's own markup stays special tokens: llama.cpp's ``parse_special`` false for user text,
as llama-server tokenizes message content apart from its template.

How: before the template renders, each such text in the request's strings is replaced by a
placeholder of ASCII letters and digits that holds a per-request random nonce (no client can
write it, and templates pass it through as they pass text, ``tojson`` included); after
rendering, the prompt is tokenized between the placeholders as before, and each placeholder as
its text spelled (``Tokenizer.encode_plain``). So a ``</think>`` a model wrote in its reasoning
and the client sent back, replayed inside the template's own ``<think>...</think>``, is the
model's text, not an early end of the reasoning; and a user's message cannot close its turn
with ``<|assistant|>``.

An assistant message's ``content`` keeps ``<think>`` and ``</think>`` as they are: templates read
them there (GLM-4.7's and the R1 distills' split reasoning off a past answer at ``</think>``).
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterable
from typing import Any

from glmserve.engine.base import Tokenizer
from glmserve.toolcalls.reasoning import THINK_END, THINK_START


class PlainText:
    """The texts to keep plain for one model (``texts``: its special tokens' and tags')."""

    def __init__(self, texts: Iterable[str]) -> None:
        texts = sorted({t for t in texts if t}, key=len, reverse=True)
        self._all = re.compile("|".join(map(re.escape, texts))) if texts else None
        answer = [t for t in texts if t not in (THINK_START, THINK_END)]
        self._answer = re.compile("|".join(map(re.escape, answer))) if answer else None

    def guard(self, messages: list[dict[str, Any]], tools: Any) -> Guarded:
        """``messages`` (template-ready dicts) and ``tools`` (any JSON value) with the texts
        replaced by placeholders, new objects (the arguments are not changed)."""
        guarded = Guarded()
        if self._all is None:
            guarded.messages, guarded.tools = messages, tools
            return guarded
        guarded.messages = [{k: self._walk(v, guarded, self._answer if k == "content" and m.get("role") == "assistant"
                                           else self._all) for k, v in m.items()} for m in messages]
        guarded.tools = self._walk(tools, guarded, self._all)
        return guarded

    def _walk(self, value: Any, guarded: Guarded, pattern: re.Pattern | None) -> Any:
        if isinstance(value, str):
            return pattern.sub(guarded.placeholder, value) if pattern is not None else value
        if isinstance(value, dict):
            return {self._walk(k, guarded, self._all): self._walk(v, guarded, pattern) for k, v in value.items()}
        if isinstance(value, list):
            return [self._walk(v, guarded, pattern) for v in value]
        return value


class Guarded:
    """One request's guarded ``messages`` and ``tools``, and what its placeholders stand for."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.tools: Any = None
        self._texts: list[str] = []
        self._nonce = secrets.token_hex(8)
        self._pattern = re.compile(f"GLMSERVE{self._nonce}X([0-9]+)X")

    def placeholder(self, match: re.Match) -> str:
        self._texts.append(match.group())
        return f"GLMSERVE{self._nonce}X{len(self._texts) - 1}X"

    def text(self, rendered: str) -> str:
        """The rendered prompt with each placeholder's text back in it."""
        return self._pattern.sub(lambda m: self._texts[int(m[1])], rendered) if self._texts else rendered

    def token_ids(self, rendered: str, tokenizer: Tokenizer) -> list[int]:
        """``rendered`` tokenized as ``Tokenizer.encode_prompt`` does, each placeholder as its
        text spelled by ordinary tokens."""
        if not self._texts:
            return tokenizer.encode_prompt(rendered)
        parts = self._pattern.split(rendered)  # text, index, text, index, ..., text
        ids = tokenizer.encode_prompt(parts[0])
        spelled: dict[str, list[int]] = {}  # each distinct text encoded once (a client may repeat one)
        for index, text in zip(parts[1::2], parts[2::2]):
            special = self._texts[int(index)]
            if special not in spelled:
                spelled[special] = tokenizer.encode_plain(special)
            ids += spelled[special]
            ids += tokenizer.encode(text) if text else []
        return ids
