"""Tool-call parsers: the model's native call format -> OpenAI ``tool_calls``.

One parser per format (vLLM's ``tool_parsers`` layout), registered by name. Every parser is
incremental: ``feed(delta_text)`` returns ``DeltaEvent``s as soon as they are certain, and
``finish()`` flushes at the end of generation. ``parse(text)`` is ``feed`` + ``finish`` with the
events assembled, so a stream and a whole response go through the same code and the joined
stream always equals the whole result.

Rules shared by all formats: text that cannot be part of a call is released at once (only a
possible partial start tag is held back); a call is held until it is complete, then emitted as
a call if it is valid (known function name, arguments that parse) or else returned as content,
never dropped, except a call cut off by ``max_tokens`` (``finish(truncated=True)``), which is
dropped so that no unfinished call text reaches ``content``. Content has its leading and
trailing whitespace removed (the formats put newlines around calls and after role markers).

The GLM-4.5+ formats stream a call instead (``glm45.py``): its head as soon as the name is
known, then its arguments as JSON pieces as the values come; from the head on it is a call,
and one cut off by ``max_tokens`` keeps the arguments it had (unfinished JSON, as OpenAI's API
streams and returns a call cut by ``max_tokens``).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

EventKind = Literal["content", "reasoning", "tool_call"]


@dataclass(slots=True)
class DeltaEvent:
    """``content``/``reasoning``: ``text``. ``tool_call``: part of call ``index`` (0-based
    within the reply): its head, with ``name`` set and ``arguments`` (JSON text of an object)
    whole or empty, or, with ``name`` empty, the next piece of its ``arguments``. Joined in
    order, a call's pieces are its JSON arguments (OpenAI's streamed ``tool_calls`` shape)."""

    kind: EventKind
    text: str = ""
    index: int = 0
    name: str = ""
    arguments: str = ""


@dataclass(slots=True)
class ToolCallItem:
    name: str
    arguments: str  # JSON text of an object


@dataclass(slots=True)
class ParsedOutput:
    content: str | None
    tool_calls: list[ToolCallItem] = field(default_factory=list)
    reasoning_content: str | None = None


def assemble(events: list[DeltaEvent]) -> ParsedOutput:
    """The reply ``events`` make: content and reasoning joined, each call's head and argument
    pieces joined by ``index``."""
    content = "".join(e.text for e in events if e.kind == "content")
    reasoning = "".join(e.text for e in events if e.kind == "reasoning")
    calls: dict[int, ToolCallItem] = {}
    for e in events:
        if e.kind == "tool_call":
            calls.setdefault(e.index, ToolCallItem(e.name, "")).arguments += e.arguments
    return ParsedOutput((content or None) if calls else content, list(calls.values()), reasoning or None)


def partial_suffix(text: str, tag: str) -> int:
    """Length of the longest tail of ``text`` that is a proper prefix of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class _TextStream:
    """Emits one kind of text with leading whitespace dropped and trailing whitespace held
    until more text follows (dropped at the end)."""

    __slots__ = ("kind", "_started", "_pending")

    def __init__(self, kind: EventKind) -> None:
        self.kind: EventKind = kind
        self._started = False
        self._pending = ""

    def add(self, text: str, out: list[DeltaEvent]) -> None:
        if not self._started:
            text = text.lstrip()
            if not text:
                return
            self._started = True
        body = text.rstrip()
        if body:
            out.append(DeltaEvent(self.kind, self._pending + body))
            self._pending = text[len(body):]
        else:
            self._pending += text


class ToolCallParser(ABC):
    """Base of every format. ``tools``: the request's function definitions (OpenAI ``function``
    objects: ``name``, ``parameters``); names outside it are not calls.

    Class attributes: ``name`` (registry key), ``markers`` (chat-template text that identifies
    the format), ``end_of_turn`` (special tokens that end the model's turn in this format, e.g.
    GLM's ``<|observation|>``), ``always_active`` (the parser also reads replies when no tools
    are offered, e.g. GLM-4's leading newline of a plain answer), ``tags`` (the tags it matches
    in the text, which a vocabulary may hold as special tokens: ``toolcalls.tag_texts``).
    """

    name: ClassVar[str]
    markers: ClassVar[tuple[str, ...]] = ()
    end_of_turn: ClassVar[tuple[str, ...]] = ()
    always_active: ClassVar[bool] = False
    tags: ClassVar[tuple[str, ...]] = ()

    def __init__(self, tools: list[dict[str, Any]] | None = None) -> None:
        self.schemas: dict[str, dict] = {t["name"]: t.get("parameters") or {} for t in tools or []}
        self._content = _TextStream("content")
        self._n_calls = 0
        self.unread: list[str] = []  # calls that could not be read, returned as content (for the log)

    @abstractmethod
    def feed(self, text: str) -> list[DeltaEvent]: ...

    @abstractmethod
    def finish(self, truncated: bool = False) -> list[DeltaEvent]:
        """Flush at the end of generation; ``truncated``: the reply was cut by ``max_tokens``."""

    def parse(self, text: str) -> ParsedOutput:
        return assemble(self.feed(text) + self.finish())

    # helpers for subclasses
    def _emit_content(self, text: str, out: list[DeltaEvent]) -> None:
        if text:
            self._content.add(text, out)

    def _emit_call(self, name: str, arguments: dict, out: list[DeltaEvent]) -> None:
        out.append(DeltaEvent("tool_call", index=self._n_calls, name=name,
                              arguments=json.dumps(arguments, ensure_ascii=False)))
        self._n_calls += 1

    def _known(self, name: str) -> bool:
        return name in self.schemas


class TaggedCallParser(ToolCallParser):
    """Formats that wrap each call in ``start_tag ... end_tag`` (hermes, GLM-4.5).
    Subclasses implement ``decode(body) -> (name, arguments) | None``."""

    start_tag: ClassVar[str] = "<tool_call>"
    end_tag: ClassVar[str] = "</tool_call>"
    tags = (start_tag, end_tag)

    def __init__(self, tools: list[dict[str, Any]] | None = None) -> None:
        super().__init__(tools)
        self._buf = ""
        self._in_call = False

    def decode(self, body: str) -> tuple[str, dict] | None:
        """A whole call's ``body`` (the text between the tags) as ``(name, arguments)``, or None
        when it is not a valid call. Formats that keep the default ``_advance_call`` implement it."""
        raise NotImplementedError

    def feed(self, text: str) -> list[DeltaEvent]:
        out: list[DeltaEvent] = []
        self._buf += text
        self._scan(out)
        return out

    def _scan(self, out: list[DeltaEvent]) -> None:
        while True:
            if self._in_call:
                if not self._advance_call(out):
                    return
                continue
            start = self._buf.find(self.start_tag)
            if start >= 0:
                self._emit_content(self._buf[:start], out)
                self._buf = self._buf[start + len(self.start_tag):]
                self._in_call = True
                continue
            keep = partial_suffix(self._buf, self.start_tag)
            self._emit_content(self._buf[: len(self._buf) - keep], out)
            self._buf = self._buf[len(self._buf) - keep:]
            return

    def _advance_call(self, out: list[DeltaEvent]) -> bool:
        """Read the open call's text in ``_buf``; True once the call has ended (``_in_call``
        cleared, ``_buf`` holding what follows). By default a call is held until its end tag
        and then decoded whole: a call, or content when ``decode`` refuses it."""
        end = self._buf.find(self.end_tag)
        if end < 0:
            return False
        body, self._buf = self._buf[:end], self._buf[end + len(self.end_tag):]
        self._in_call = False
        decoded = self.decode(body)
        if decoded is None:
            self.unread.append(self.start_tag + body + self.end_tag)
            self._emit_content(self.start_tag + body + self.end_tag, out)
        else:
            self._emit_call(*decoded, out)
        return True

    def _finish_call(self, truncated: bool, out: list[DeltaEvent]) -> None:
        """The generation ended inside a call: an unclosed call is content, unless
        ``max_tokens`` cut it (then it is dropped)."""
        if not truncated:
            self._emit_content(self.start_tag + self._buf, out)

    def finish(self, truncated: bool = False) -> list[DeltaEvent]:
        out: list[DeltaEvent] = []
        if self._in_call:
            self._finish_call(truncated, out)
        else:
            self._emit_content(self._buf, out)
        self._buf, self._in_call = "", False
        return out


class HeadDecidedParser(ToolCallParser):
    """Formats where the start of the reply decides (GLM-4, generic): plain text, streamed as it
    comes from then on, or a call, held in ``_buf``. Subclasses implement ``_advance(out)``,
    called after each feed while undecided or in a call, and call ``_to_content(out)`` once the
    reply is known to be text."""

    def __init__(self, tools: list[dict[str, Any]] | None = None) -> None:
        super().__init__(tools)
        self._mode = "head"  # head -> content | call
        self._buf = ""

    @abstractmethod
    def _advance(self, out: list[DeltaEvent]) -> None: ...

    def feed(self, text: str) -> list[DeltaEvent]:
        out: list[DeltaEvent] = []
        if self._mode == "content":
            self._emit_content(text, out)
            return out
        self._buf += text
        self._advance(out)
        return out

    def _to_content(self, out: list[DeltaEvent]) -> None:
        self._mode, rest, self._buf = "content", self._buf, ""
        self._emit_content(rest, out)
