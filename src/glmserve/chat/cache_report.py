"""Where a prompt's prefill started (the miss report): the first prompt token the engine did not
read from its prefix cache, the message that token falls in, and the prompt's text from there.
The pipeline logs it at debug for every request (``glmserve.prompt``), so an operator sees why a
session's prompt was computed again: ``prefill from token 12 of 20222 in messages[0] (system):
'0d5; cc_entrypoint=sdk-cli;...'`` names a per-session line (``--prompt-normalize``).

A token is placed by the messages' texts: each message's first characters are found in the
prompt's text in order; a token inside a message's text is in that message, and one in what the
template writes between two texts (a role marker, the tools after the system message) is after
the message before it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

ANCHOR_CHARS = 24  # a message's text is found in the prompt by its first characters
SHOWN_CHARS = 48  # the prompt's text shown from the first computed token
MAX_MISSES = 32  # messages in a row whose text the prompt does not hold before the search stops


@dataclass(frozen=True, slots=True)
class PrefillStart:
    """``token``: the index of the first prompt token computed (``cached``; equal to the prompt's
    length when all of it was read); ``message``: the index of the message whose text holds it,
    or None when it is in what the template writes between two messages' texts (a role marker,
    the tools), after the text of ``after`` (None: before the first message's); ``roles``: the
    messages' roles, for the log; ``text``: the prompt's text from that token, at most
    ``SHOWN_CHARS`` characters."""

    token: int
    prompt_tokens: int
    message: int | None
    after: int | None
    roles: tuple[str, ...]
    text: str

    @classmethod
    def at(cls, token: int, prompt_tokens: int) -> PrefillStart:
        """The start of a prompt given as text or tokens (no messages to place it in), not decoded."""
        return cls(min(max(token, 0), prompt_tokens), prompt_tokens, None, None, (), "")

    def report(self) -> dict[str, Any]:
        """The usage extension's fields (``protocol.usage.PrefillReport``): the token, and the
        message (index and role) holding it or the message it comes after; no text."""
        if not self.roles:
            return {"token": self.token}
        if self.message is not None:
            return {"token": self.token, "message": self.message, "role": self.roles[self.message]}
        return {"token": self.token, "after": self.after}

    def _name(self, i: int) -> str:
        return f"messages[{i}] ({self.roles[i]})"

    def __str__(self) -> str:
        if self.message is not None:
            where = f" in {self._name(self.message)}"
        elif self.roles:
            where = " before messages[0]" if self.after is None else f" after {self._name(self.after)}"
        else:
            where = ""
        return f"prefill from token {self.token} of {self.prompt_tokens}{where}: {self.text!r}"


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(p.get("text") or "" for p in content if isinstance(p, dict) and p.get("type") == "text")
    return content.strip() if isinstance(content, str) else ""


def prefill_start(decode: Callable[[list[int]], str], token_ids: Sequence[int], cached: int,
                  messages: Sequence[dict[str, Any]] = ()) -> PrefillStart:
    """Where the prefill of ``token_ids`` started after ``cached`` tokens were read from the cache
    (``decode``: the tokenizer's, special tokens written out; ``messages``: the template messages
    the prompt was rendered from). Decodes the prompt once, in two parts at ``cached`` (a
    character split there shows as U+FFFD), once per request. Each message's text is looked for
    between the last one's end and the token, so the work is bounded by the messages times that
    span; ``MAX_MISSES`` messages in a row that the prompt does not hold verbatim (a template that
    rewrites them, a hostile request of many) end the search, the token then placed after the
    last message found."""
    ids = list(token_ids)
    start = min(max(cached, 0), len(ids))
    head = decode(ids[:start])
    whole, offset = head + decode(ids[start:]), len(head)
    message = after = None
    position = misses = 0
    for i, m in enumerate(messages):
        text = _text(m)
        if not text:
            continue
        # only a message starting before the token matters: the search ends there
        found = whole.find(text[:ANCHOR_CHARS], position, offset + ANCHOR_CHARS)
        if found < 0:
            misses += 1
            if misses == MAX_MISSES:  # a template that rewrites the texts: no place, and no more scans
                break
            continue
        if found > offset:  # it starts after the token
            break
        misses = 0
        end = found + len(text) if whole.startswith(text, found) else found + ANCHOR_CHARS
        position = end
        message, after = (i, None) if offset < end else (None, i)
    roles = tuple(str(m.get("role")) for m in messages)
    return PrefillStart(start, len(ids), message, after, roles, whole[offset:offset + SHOWN_CHARS])
