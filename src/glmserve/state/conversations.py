"""``ConversationStore``: OpenAI's conversations, each an ordered list of items (the JSON dicts
the serving layer gives, each with an ``id``) and ``metadata``, scoped to an owner. Unlike
responses they do not expire (as on OpenAI's API); their items count against the store's
size bounds (``quota.Quota``: the owner's oldest stored responses go first, then a write that
would pass a bound is refused). Blocking calls, run in a thread by the serving layer."""

from __future__ import annotations

import json
import time
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from glmserve.state.quota import charge
from glmserve.state.responses import ResponseStore
from glmserve.state.tables import CONVERSATIONS, ITEMS, dumps, keyset_page


class ConversationStore:
    """Conversations in the database of ``responses`` (a ``ResponseStore``, whose size bound
    they share: ``quota.Quota.reserve``, which raises ``StoreFull``)."""

    def __init__(self, responses: ResponseStore) -> None:
        self.responses = responses
        self.database = responses.database

    @staticmethod
    def _object(row) -> dict[str, Any]:
        return {"id": row.id, "object": "conversation", "created_at": int(row.created_at),
                "metadata": json.loads(row.metadata)}

    def _mine(self, conn: Connection, owner: str, conversation_id: str):
        return conn.execute(sa.select(CONVERSATIONS).where(CONVERSATIONS.c.id == conversation_id,
                                                           CONVERSATIONS.c.owner == owner)).first()

    def _append(self, conn: Connection, owner: str, conversation_id: str, items: list[dict[str, Any]]) -> None:
        rows = [{"conversation_id": conversation_id, "item_id": item["id"], "body": (body := dumps(item)),
                 "size": len(body.encode())} for item in items]
        if not rows:
            return
        self.responses.quota.reserve(conn, owner, sum(r["size"] for r in rows))
        conn.execute(sa.insert(ITEMS), rows)

    def create(self, owner: str, conversation_id: str, metadata: dict[str, str],
               items: list[dict[str, Any]]) -> dict[str, Any]:
        """A new conversation holding ``items``. Raises ``StoreFull``."""
        with self.database.begin() as conn:
            charge(conn, owner, 0)  # the store's write lock
            conn.execute(sa.insert(CONVERSATIONS).values(id=conversation_id, owner=owner, created_at=time.time(),
                                                         metadata=dumps(metadata)))
            self._append(conn, owner, conversation_id, items)
            row = self._mine(conn, owner, conversation_id)
        return self._object(row)

    def get(self, owner: str, conversation_id: str) -> dict[str, Any] | None:
        with self.database.connect() as conn:
            row = self._mine(conn, owner, conversation_id)
        return None if row is None else self._object(row)

    def update(self, owner: str, conversation_id: str, metadata: dict[str, str]) -> dict[str, Any] | None:
        with self.database.begin() as conn:
            conn.execute(sa.update(CONVERSATIONS).where(CONVERSATIONS.c.id == conversation_id,
                                                        CONVERSATIONS.c.owner == owner).values(
                metadata=dumps(metadata)))
            row = self._mine(conn, owner, conversation_id)
        return None if row is None else self._object(row)

    def delete(self, owner: str, conversation_id: str) -> bool:
        with self.database.begin() as conn:
            charge(conn, owner, 0)  # the store's write lock: no item is added meanwhile
            if self._mine(conn, owner, conversation_id) is None:
                return False
            self._drop_items(conn, owner, ITEMS.c.conversation_id == conversation_id)
            conn.execute(sa.delete(CONVERSATIONS).where(CONVERSATIONS.c.id == conversation_id))
        return True

    @staticmethod
    def _drop_items(conn: Connection, owner: str, where: sa.ColumnElement) -> int:
        """Delete the items matching ``where`` (``owner``'s) and take their bytes off its use;
        how many."""
        count, size = conn.execute(sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(ITEMS.c.size), 0))
                                   .where(where)).one()
        conn.execute(sa.delete(ITEMS).where(where))
        charge(conn, owner, -int(size))
        return int(count)

    def add_items(self, owner: str, conversation_id: str, items: list[dict[str, Any]]) -> bool:
        """Append ``items``; False when ``owner`` has no such conversation (or it is deleted
        meanwhile: its existence is read under the store's write lock). Raises ``StoreFull``."""
        with self.database.begin() as conn:
            charge(conn, owner, 0)  # the store's write lock
            if self._mine(conn, owner, conversation_id) is None:
                return False
            self._append(conn, owner, conversation_id, items)
        return True

    def items(self, owner: str, conversation_id: str) -> list[dict[str, Any]] | None:
        """Every item, oldest first; None when ``owner`` has no such conversation."""
        with self.database.connect() as conn:
            if self._mine(conn, owner, conversation_id) is None:
                return None
            rows = conn.execute(sa.select(ITEMS.c.body).where(ITEMS.c.conversation_id == conversation_id)
                                .order_by(ITEMS.c.seq))
            return [json.loads(row.body) for row in rows]

    def page_items(self, owner: str, conversation_id: str, after: str | None, limit: int,
                   descending: bool) -> list[dict[str, Any]] | None:
        """Up to ``limit + 1`` items after the item ``after`` in the conversation's order (or its
        reverse); None when ``owner`` has no such conversation. Raises ``UnknownCursor``."""
        mine = ITEMS.c.conversation_id == conversation_id
        with self.database.connect() as conn:
            if self._mine(conn, owner, conversation_id) is None:
                return None
            cursor = None if after is None else sa.select(ITEMS.c.seq).where(mine, ITEMS.c.item_id == after).limit(1)
            rows = keyset_page(conn, sa.select(ITEMS.c.body).where(mine), (ITEMS.c.seq,), cursor, limit, descending)
        return [json.loads(row.body) for row in rows]

    def item(self, owner: str, conversation_id: str, item_id: str) -> dict[str, Any] | bool | None:
        """The item ``item_id``; False when the conversation has none, None when ``owner`` has
        no such conversation."""
        with self.database.connect() as conn:
            if self._mine(conn, owner, conversation_id) is None:
                return None
            body = conn.execute(sa.select(ITEMS.c.body).where(ITEMS.c.conversation_id == conversation_id,
                                                              ITEMS.c.item_id == item_id)
                                .order_by(ITEMS.c.seq).limit(1)).scalar_one_or_none()
        return False if body is None else json.loads(body)

    def delete_item(self, owner: str, conversation_id: str, item_id: str) -> bool:
        with self.database.begin() as conn:
            charge(conn, owner, 0)  # the store's write lock
            if self._mine(conn, owner, conversation_id) is None:
                return False
            return self._drop_items(conn, owner, sa.and_(ITEMS.c.conversation_id == conversation_id,
                                                         ITEMS.c.item_id == item_id)) > 0
