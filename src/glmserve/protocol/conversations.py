"""OpenAI's Conversations API request bodies (``/v1/conversations``): items are Responses
input items (``protocol/responses.py``), at most 20 per request as on OpenAI's API; metadata is
at most 16 string pairs."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from glmserve.protocol.chat import Metadata, _Lenient

MAX_ITEMS_PER_REQUEST = 20


class ConversationCreateRequest(_Lenient):
    items: list[dict[str, Any]] | None = Field(None, max_length=MAX_ITEMS_PER_REQUEST)
    metadata: Metadata | None = None


class ConversationUpdateRequest(_Lenient):
    metadata: Metadata


class ItemsCreateRequest(_Lenient):
    items: list[dict[str, Any]] = Field(min_length=1, max_length=MAX_ITEMS_PER_REQUEST)
