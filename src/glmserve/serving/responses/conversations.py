"""OpenAI's Conversations API over a ``state.ConversationStore``: create, retrieve, update and
delete a conversation; add, list, retrieve and delete its items. A conversation belongs to the
API key that made it: another key gets a 404, as for a missing id. ``/v1/responses`` with
``conversation`` reads the items before its input and appends its input and output after it
(``serving/responses/stored.py``)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from glmserve.protocol.conversations import ConversationCreateRequest, ItemsCreateRequest
from glmserve.protocol.errors import APIError, invalid_request
from glmserve.serving.items import is_stored_id, list_object, stored_items, unknown_cursor
from glmserve.state import ConversationStore, StoreFull, UnknownCursor



def conversation_not_found(conversation_id: str) -> APIError:
    return APIError(404, f"Conversation with id '{conversation_id}' not found.", "invalid_request_error", None, None)


class ConversationService:
    """The routes' handlers; ``store`` None: a stateless server, where every route is a 404."""

    def __init__(self, store: ConversationStore | None) -> None:
        self.store = store

    async def _call(self, method: str, *args: Any) -> Any:
        if self.store is None:
            raise APIError(404, "conversations are not stored on this server", "invalid_request_error", None, None)
        try:
            return await asyncio.to_thread(getattr(self.store, method), *args)
        except StoreFull as exc:
            raise invalid_request(str(exc), None, "store_full") from None

    async def _existing(self, method: str, owner: str, conversation_id: str, *args: Any) -> Any:
        result = await self._call(method, owner, conversation_id, *args) if is_stored_id(conversation_id) else None
        if result is None or result is False:
            raise conversation_not_found(conversation_id)
        return result

    async def create(self, req: ConversationCreateRequest, owner: str) -> dict:
        items = stored_items(req.items or [], "items")
        return await self._call("create", owner, f"conv_{uuid.uuid4().hex}", req.metadata or {}, items)

    async def get(self, conversation_id: str, owner: str) -> dict:
        return await self._existing("get", owner, conversation_id)

    async def update(self, conversation_id: str, owner: str, metadata: dict[str, str]) -> dict:
        return await self._existing("update", owner, conversation_id, metadata)

    async def delete(self, conversation_id: str, owner: str) -> dict:
        await self._existing("delete", owner, conversation_id)
        return {"id": conversation_id, "object": "conversation.deleted", "deleted": True}

    async def items(self, conversation_id: str, owner: str) -> list[dict]:
        """Every item, oldest first. Raises 404."""
        return await self._existing("items", owner, conversation_id)

    async def add_items(self, conversation_id: str, owner: str, req: ItemsCreateRequest) -> dict:
        added = stored_items(req.items, "items")
        await self.append(conversation_id, owner, added)
        return {"object": "list", "data": added, "first_id": added[0]["id"], "last_id": added[-1]["id"],
                "has_more": False}

    async def append(self, conversation_id: str, owner: str, items: list[dict]) -> None:
        """Append stored ``items``. Raises 404, or 400 (``store_full``)."""
        await self._existing("add_items", owner, conversation_id, items)

    async def list_items(self, conversation_id: str, owner: str, after: str | None, limit: int,
                         order: str) -> dict:
        try:
            rows = await self._existing("page_items", owner, conversation_id, after, limit, order == "desc")
        except UnknownCursor:
            raise unknown_cursor(after or "", f"conversation '{conversation_id}'") from None
        return list_object(rows, limit)

    async def get_item(self, conversation_id: str, owner: str, item_id: str) -> dict:
        found = await self._call("item", owner, conversation_id, item_id) if is_stored_id(conversation_id) else None
        if found is None:
            raise conversation_not_found(conversation_id)
        if found is False:
            raise APIError(404, f"Item with id '{item_id}' not found.", "invalid_request_error", None, None)
        return found

    async def delete_item(self, conversation_id: str, owner: str, item_id: str) -> dict:
        """Delete the item; the conversation object, as OpenAI answers. Raises 404."""
        conversation = await self.get(conversation_id, owner)
        if not await self._call("delete_item", owner, conversation_id, item_id):
            raise APIError(404, f"Item with id '{item_id}' not found.", "invalid_request_error", None, None)
        return conversation
