"""Reasoning text (``<think>...</think>``) split from the answer, whatever the tool-call format.

Templates that write ``<think>`` (GLM-4.5+, Qwen3, DeepSeek-R1 distills) put the reasoning
before the answer. Where the reasoning starts depends on the template's generation prompt, so
the parser starts from where the rendered prompt left off (``prompt_state``):

- ``reasoning``: the prompt ends in ``<think>`` (GLM-4.7 / 5.x, Qwen3 thinking, DeepSeek-R1
  distills): the model's first output is reasoning, ended by ``</think>``;
- ``answer``: the prompt ends in ``</think>`` (thinking turned off: GLM-4.7's ``enable_thinking``
  false, GLM-4.5's ``<think></think>``): the output is answer, unless the model reasons anyway:
  a ``<think>...</think>`` at its very start is reasoning (held back until ``</think>`` comes;
  never closed, it was the answer's own text: ``<think> is a tag``), and so is text the model
  writes before a ``</think>`` of its own that starts within the output's first ``LEAD_CHARS``
  characters (``Two plus two makes four.</think>The answer is 4.``: a model that was not
  trained for thinking off, or ignores it). That lead is held back until the ``</think>``, a
  call's start tag, the end, or ``LEAD_CHARS`` characters without one (the answer's first
  characters then stream that much later); a ``</think>`` past it is the answer's own text.
  Output a grammar constrains (``constrained``) has no such lead: a ``</think>`` in its JSON is text;
- ``open``: neither: a ``<think>...</think>`` at the very start of the output is reasoning
  (GLM-4.5 / 4.6 write it themselves).

A parser that waits for ``<think>`` in the output when the prompt already opened it returns the
whole reasoning as the answer (vLLM #33348). A tool call's start tag written inside the
reasoning ends it (vLLM #46040: the call would otherwise be swallowed as reasoning). Reasoning
cut off by ``max_tokens`` stays reasoning.
"""

from __future__ import annotations

from typing import Any, Literal

from glmserve.toolcalls.base import DeltaEvent, TaggedCallParser, ToolCallParser, _TextStream, partial_suffix

THINK_START, THINK_END = "<think>", "</think>"
# thinking off: a </think> the model writes starting within this many characters of its output
# ends reasoning it wrote without <think> (the answer is held back that far)
LEAD_CHARS = 512
PromptState = Literal["reasoning", "answer", "open"]


def has_reasoning(template_source: str | None) -> bool:
    """Whether a chat template writes ``<think>...</think>`` reasoning (both tags in its text)."""
    return bool(template_source) and THINK_START in template_source and THINK_END in template_source


def prompt_state(prompt_text: str) -> PromptState:
    """Where the rendered prompt (generation prompt included) leaves the model: ``reasoning``
    when it ends in ``<think>``, ``answer`` when it ends in ``</think>``, else ``open``
    (trailing whitespace ignored)."""
    tail = prompt_text.rstrip()
    if tail.endswith(THINK_END):
        return "answer"
    if tail.endswith(THINK_START):
        return "reasoning"
    return "open"


class ReasoningParser(ToolCallParser):
    """``<think>`` reasoning -> ``reasoning`` events; the answer after it goes to ``inner`` (the
    tool-call parser) or, without one, becomes ``content``. ``state``: ``prompt_state`` of the
    rendered prompt; ``constrained``: a grammar writes the output from its first character (no
    lead before a ``</think>`` is then taken for reasoning); ``call_tag``: a call's start tag that
    ends the reasoning (default: ``inner``'s, when it has tools to call)."""

    name = "reasoning"

    def __init__(self, inner: ToolCallParser | None, state: PromptState, tools: list[dict[str, Any]] | None = None,
                 constrained: bool = False, call_tag: str | None = None) -> None:
        super().__init__(tools)
        self.inner = inner
        self._state, self._constrained = state, constrained
        self._phase = {"reasoning": "think", "answer": "start", "open": "start"}[state]
        # thinking was off: reasoning the model opens anyway is held back until it closes, and
        # (unless a grammar writes the output) a lead it writes without <think> until it closes
        # or cannot anymore (LEAD_CHARS)
        self._tentative = state == "answer"
        self._lead_chars = 0 if constrained else LEAD_CHARS
        self._head = ""
        self._scanned = 0  # held-back reasoning (tentative) was searched for its end tags up to here
        self._reasoning = _TextStream("reasoning")
        # a call's start tag inside the reasoning ends it, when calls can be made
        self._call_tag = call_tag or (inner.start_tag if isinstance(inner, TaggedCallParser) and inner.schemas
                                      else None)
        if inner is not None:
            self.unread = inner.unread  # the inner parser's calls that could not be read

    @property
    def in_reasoning(self) -> bool:
        """Whether the text fed so far has opened the reasoning and not ended it."""
        return self._phase == "think"

    @property
    def settled(self) -> bool:
        """Whether the reasoning is over or there was none: the text from here is the answer's
        (and ``in_reasoning`` stays False whatever is fed)."""
        return self._phase == "body"

    def phases(self) -> ReasoningParser:
        """A new parser of the same reply's reasoning alone (the same prompt state, lead and
        call tag; no inner parser): for a reader that follows only where the reasoning is, fed
        the same text (the reasoning budget and loop guard, ``serving/generation/reasoning_budget.py``)."""
        return ReasoningParser(None, self._state, constrained=self._constrained, call_tag=self._call_tag)

    def feed(self, text: str) -> list[DeltaEvent]:
        if self._phase == "body":
            return self._body(text)
        out: list[DeltaEvent] = []
        self._head += text
        if self._phase == "start":
            stripped = self._head.lstrip()
            if not stripped.startswith(THINK_START):
                if THINK_START.startswith(stripped):  # could still become "<think>"
                    return out
                if not (self._tentative and self._lead_chars):
                    self._phase, rest, self._head = "body", self._head, ""
                    return self._body(rest)
                self._phase = "lead"
            else:
                self._phase, self._head = "think", stripped[len(THINK_START):]
        if self._phase == "lead":
            return self._lead()
        ends = [(i, tag) for tag in (THINK_END, self._call_tag)
                if tag and (i := self._head.find(tag, self._scanned)) >= 0]
        if ends:
            i, tag = min(ends)
            self._reasoning.add(self._head[:i], out)
            rest = self._head[i + len(THINK_END):] if tag == THINK_END else self._head[i:]
            self._phase, self._head = "body", ""
            return out + self._body(rest)
        if self._tentative:  # not known to be reasoning until it closes; searched once
            self._scanned = max(0, len(self._head) - max(len(THINK_END), len(self._call_tag or "")) + 1)
            return out
        keep = max(partial_suffix(self._head, tag) for tag in (THINK_END, self._call_tag or THINK_END))
        self._reasoning.add(self._head[: len(self._head) - keep], out)
        self._head = self._head[len(self._head) - keep:]
        return out

    def _lead(self) -> list[DeltaEvent]:
        """Thinking off, output that did not open ``<think>``: reasoning where a ``</think>``
        starts within ``LEAD_CHARS`` characters (before any call's start tag), else the answer."""
        head, out = self._head, []
        end = head.find(THINK_END, 0, self._lead_chars + len(THINK_END))
        call = head.find(self._call_tag, 0, end if end >= 0 else len(head)) if self._call_tag else -1
        if end >= 0 and call < 0:
            self._reasoning.add(head[:end], out)
        elif call < 0 and len(head) < self._lead_chars + len(THINK_END):  # a </think> may still start in the lead
            return out
        self._phase, self._head = "body", ""
        return out + self._body(head[end + len(THINK_END):] if end >= 0 and call < 0 else head)

    def finish(self, truncated: bool = False) -> list[DeltaEvent]:
        out: list[DeltaEvent] = []
        head, self._head = self._head, ""
        if self._phase == "think" and self._tentative:  # never closed: the answer's own text
            self._phase = "body"
            out += self._body(THINK_START + head)
        elif self._phase == "think":  # reasoning cut off (max_tokens): it stays reasoning
            self._reasoning.add(head, out)
        elif head:
            out += self._body(head)
        if self.inner is not None:
            return out + self.inner.finish(truncated)
        return out

    def _body(self, text: str) -> list[DeltaEvent]:
        if self.inner is not None:
            return self.inner.feed(text)
        out: list[DeltaEvent] = []
        self._emit_content(text, out)
        return out
