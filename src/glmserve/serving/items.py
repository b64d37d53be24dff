"""Stored Responses items (a response's input items, a conversation's items): their stored
form (``stored_items``) and OpenAI's paged list of them (``page``)."""

from __future__ import annotations

import re
import uuid
from typing import Any

from glmserve.protocol.errors import invalid_request

ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning")
ROLES = ("user", "assistant", "system", "developer")
_ID = re.compile(r"[A-Za-z0-9_-]{1,80}")


def is_stored_id(value: str) -> bool:
    """Whether ``value`` can be an id this server made (``resp_...``, ``conv_...``,
    ``file-...``, ``batch_...``): anything else is not looked up, so no odd bytes reach the
    database."""
    return _ID.fullmatch(value) is not None


_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}


def stored_items(raw: str | list[dict[str, Any]], param: str = "input") -> list[dict[str, Any]]:
    """``raw`` as stored items, each with an ``id``: a string is one user message; a message's
    string content becomes one ``input_text`` part (``output_text`` for the assistant), as
    OpenAI lists items. Raises 400 naming an item of another type or role."""
    if isinstance(raw, str):
        raw = [{"type": "message", "role": "user", "content": raw}]
    items = []
    for i, item in enumerate(raw):
        item = dict(item)
        kind = item.setdefault("type", "message")
        if kind not in ITEM_TYPES:
            raise invalid_request(f"unsupported item type {kind!r}", f"{param}.{i}.type")
        if kind == "message":
            if item.get("role") not in ROLES:
                raise invalid_request(f"unsupported role {item.get('role')!r}", f"{param}.{i}.role")
            if isinstance(item.get("content"), str):
                part = "output_text" if item["role"] == "assistant" else "input_text"
                item["content"] = [{"type": part, "text": item["content"]}]
        if not isinstance(item.get("id"), str):
            item["id"] = f"{_PREFIX[kind]}_{uuid.uuid4().hex}"
        items.append(item)
    return items


def page(items: list[dict[str, Any]], after: str | None, limit: int, order: str, owner_name: str) -> dict:
    """OpenAI's list object of ``items`` (oldest first) in ``order`` (``asc``/``desc``): the
    ``limit`` items after the one whose id is ``after``. Raises 400 for an ``after`` not among
    them (``owner_name`` says whose items they are)."""
    items = list(reversed(items)) if order == "desc" else list(items)
    if after is not None:
        ids = [item.get("id") for item in items]
        if after not in ids:
            raise unknown_cursor(after, owner_name)
        items = items[ids.index(after) + 1:]
    return list_object(items[:limit + 1], limit)


def list_object(rows: list[dict[str, Any]], limit: int) -> dict:
    """OpenAI's list object of the first ``limit`` of ``rows`` (a page and, if there are more,
    one more row: ``has_more``)."""
    shown = rows[:limit]
    return {"object": "list", "data": shown, "first_id": shown[0]["id"] if shown else None,
            "last_id": shown[-1]["id"] if shown else None, "has_more": len(rows) > limit}


def unknown_cursor(after: str, owner_name: str) -> Exception:
    """The 400 for a list's ``after`` that is not one of ``owner_name``'s objects."""
    return invalid_request(f"item '{after}' is not an item of {owner_name}", "after")
