"""``FileStore``: uploaded files (``/v1/files``) and the batch output and error files made
here, their bytes in the state database, scoped to an owner. Every file counts against the
store's size bounds (``quota.Quota``); an upload must fit (the owner's oldest stored responses
are deleted first to make room, then one that does not fit raises ``StoreFull``), the server's
own output files are counted, never refused. Files do not expire. Blocking calls."""

from __future__ import annotations

import time
from typing import Any

import sqlalchemy as sa

from glmserve.state.responses import ResponseStore
from glmserve.state.tables import FILES, keyset_page


class FileStore:
    """Files in the database of ``responses`` (whose size bound uploads share)."""

    def __init__(self, responses: ResponseStore) -> None:
        self.responses = responses
        self.engine = responses.engine

    @staticmethod
    def _object(row) -> dict[str, Any]:
        return {"id": row.id, "object": "file", "bytes": int(row.bytes), "created_at": int(row.created_at),
                "filename": row.filename, "purpose": row.purpose, "status": "processed", "expires_at": None,
                "status_details": None}

    _COLUMNS = (FILES.c.id, FILES.c.bytes, FILES.c.created_at, FILES.c.filename, FILES.c.purpose)

    def create(self, owner: str, file_id: str, purpose: str, filename: str, content: bytes,
               bounded: bool = True) -> dict[str, Any]:
        """Store ``content`` as a new file; ``bounded``: an upload, refused with ``StoreFull``
        when it does not fit (the server's own output files are not)."""
        with self.engine.begin() as conn:
            if bounded:
                self.responses.quota.reserve(conn, owner, len(content))
            conn.execute(sa.insert(FILES).values(id=file_id, owner=owner, created_at=time.time(), purpose=purpose,
                                                 filename=filename, bytes=len(content), content=content))
            row = conn.execute(sa.select(*self._COLUMNS).where(FILES.c.id == file_id)).first()
        return self._object(row)

    def get(self, owner: str, file_id: str) -> dict[str, Any] | None:
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(*self._COLUMNS).where(FILES.c.id == file_id, FILES.c.owner == owner)).first()
        return None if row is None else self._object(row)

    def content(self, owner: str, file_id: str) -> bytes | None:
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(FILES.c.content).where(FILES.c.id == file_id, FILES.c.owner == owner)).first()
        return None if row is None else bytes(row.content)

    def page(self, owner: str, purpose: str | None, after: str | None, limit: int,
             descending: bool) -> list[dict[str, Any]]:
        """Up to ``limit + 1`` of the owner's files (``purpose``: only those) after the file
        ``after``, oldest first (or newest). Raises ``tables.UnknownCursor``."""
        mine = [FILES.c.owner == owner] + ([] if purpose is None else [FILES.c.purpose == purpose])
        cursor = None if after is None else sa.select(FILES.c.created_at, FILES.c.id).where(*mine, FILES.c.id == after)
        with self.engine.connect() as conn:
            rows = keyset_page(conn, sa.select(*self._COLUMNS).where(*mine), (FILES.c.created_at, FILES.c.id),
                               cursor, limit, descending)
        return [self._object(row) for row in rows]

    def delete(self, owner: str, file_id: str) -> bool:
        with self.engine.begin() as conn:
            gone = conn.execute(sa.delete(FILES).where(FILES.c.id == file_id, FILES.c.owner == owner))
        return gone.rowcount > 0
