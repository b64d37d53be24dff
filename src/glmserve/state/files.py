"""``FileStore``: uploaded files (``/v1/files``) and the batch output and error files made
here, scoped to an owner, their bytes in the state database in pieces of at most
``CHUNK_BYTES`` (``file_chunks``): written and read a piece at a time, so that no step holds a
whole file (a 64 MiB upload was one value, copied whole while holding the interpreter's lock).

Every file counts against the store's size bounds (``quota.Quota``); an upload must fit (room
is made as ``quota`` says, then one that does not fit raises ``StoreFull``); a batch's output
and error files are written by ``BatchStore``'s build, a piece at a time. Files do not expire.
Blocking calls."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any

import sqlalchemy as sa

from glmserve.state.quota import charge
from glmserve.state.responses import ResponseStore
from glmserve.state.tables import FILE_CHUNKS, FILES, keyset_page

CHUNK_BYTES = 1 << 20  # a stored piece of a file


def rechunk(pieces: Iterable[bytes]) -> Iterator[bytes]:
    """``pieces`` (bytes of any lengths, in order) as pieces of ``CHUNK_BYTES``, the last one
    shorter; nothing for no bytes."""
    held, size = [], 0
    for piece in pieces:
        view = memoryview(piece)
        while view:
            take = view[:CHUNK_BYTES - size]
            held.append(take)
            size += len(take)
            view = view[len(take):]
            if size == CHUNK_BYTES:
                yield b"".join(held)
                held, size = [], 0
    if size:
        yield b"".join(held)


class FileStore:
    """Files in the database of ``responses`` (whose size bound uploads share)."""

    def __init__(self, responses: ResponseStore) -> None:
        self.responses = responses
        self.database = responses.database

    @staticmethod
    def _object(row) -> dict[str, Any]:
        return {"id": row.id, "object": "file", "bytes": int(row.bytes), "created_at": int(row.created_at),
                "filename": row.filename, "purpose": row.purpose, "status": "processed", "expires_at": None,
                "status_details": None}

    _COLUMNS = (FILES.c.id, FILES.c.bytes, FILES.c.created_at, FILES.c.filename, FILES.c.purpose)

    def create(self, owner: str, file_id: str, purpose: str, filename: str,
               content: bytes | Iterable[bytes]) -> dict[str, Any]:
        """Store ``content`` (its bytes, or its bytes in pieces, read as they are stored: an
        exception from the iterable stores nothing) as a new file, refused with ``StoreFull``
        when it does not fit. One transaction: nobody sees the file before all of it is
        stored."""
        size = 0
        with self.database.begin() as conn:
            for seq, piece in enumerate(rechunk([content] if isinstance(content, bytes) else content)):
                conn.execute(sa.insert(FILE_CHUNKS).values(file_id=file_id, seq=seq, data=piece))
                size += len(piece)
            self.responses.quota.reserve(conn, owner, size)
            conn.execute(sa.insert(FILES).values(id=file_id, owner=owner, created_at=time.time(), purpose=purpose,
                                                 filename=filename, bytes=size))
            row = conn.execute(sa.select(*self._COLUMNS).where(FILES.c.id == file_id)).first()
        return self._object(row)

    def get(self, owner: str, file_id: str) -> dict[str, Any] | None:
        with self.database.connect() as conn:
            row = conn.execute(sa.select(*self._COLUMNS).where(FILES.c.id == file_id, FILES.c.owner == owner)).first()
        return None if row is None else self._object(row)

    def piece(self, file_id: str, seq: int) -> bytes | None:
        """The file's ``seq``-th piece (from 0) of its bytes; None past its last (or for a file
        that is not there: the caller checks the owner's file with ``get`` first)."""
        with self.database.connect() as conn:
            data = conn.execute(sa.select(FILE_CHUNKS.c.data).where(FILE_CHUNKS.c.file_id == file_id,
                                                                   FILE_CHUNKS.c.seq == seq)).scalar()
        return None if data is None else bytes(data)

    def pieces(self, file_id: str) -> Iterator[bytes]:
        """The file's bytes, a piece at a time, in order (nothing for a file that is not there)."""
        seq = 0
        while (data := self.piece(file_id, seq)) is not None:
            yield data
            seq += 1

    def page(self, owner: str, purpose: str | None, after: str | None, limit: int,
             descending: bool) -> list[dict[str, Any]]:
        """Up to ``limit + 1`` of the owner's files (``purpose``: only those) after the file
        ``after``, oldest first (or newest). Raises ``tables.UnknownCursor``."""
        mine = [FILES.c.owner == owner] + ([] if purpose is None else [FILES.c.purpose == purpose])
        cursor = None if after is None else sa.select(FILES.c.created_at, FILES.c.id).where(*mine, FILES.c.id == after)
        with self.database.connect() as conn:
            rows = keyset_page(conn, sa.select(*self._COLUMNS).where(*mine), (FILES.c.created_at, FILES.c.id),
                               cursor, limit, descending)
        return [self._object(row) for row in rows]

    def delete(self, owner: str, file_id: str) -> bool:
        with self.database.begin() as conn:
            charge(conn, owner, 0)  # the store's write lock
            size = conn.execute(sa.select(FILES.c.bytes).where(FILES.c.id == file_id, FILES.c.owner == owner)).scalar()
            if size is None:
                return False
            conn.execute(sa.delete(FILES).where(FILES.c.id == file_id))
            conn.execute(sa.delete(FILE_CHUNKS).where(FILE_CHUNKS.c.file_id == file_id))
            charge(conn, owner, -int(size))
        return True
