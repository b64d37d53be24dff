"""OpenAI's Files API as glmserve keeps it (``/v1/files``: ``batch`` files of JSONL request
lines, and the output and error files of batches): upload (read, checked as UTF-8 and stored a
piece at a time on a bulk worker), read, list, download a piece at a time, delete."""

from __future__ import annotations

import io
import uuid
from collections.abc import AsyncIterator
from typing import BinaryIO

from glmserve.protocol.errors import invalid_request
from glmserve.serving.batches.calls import call, not_found, require
from glmserve.serving.batches.files import checked_utf8
from glmserve.serving.items import is_stored_id, list_object, unknown_cursor
from glmserve.state import FileStore, UnknownCursor


class FileService:
    """The file routes' handlers over ``store`` (None: a stateless server, where every route is
    a 404). Files belong to the owner (the API key's digest) that made them."""

    def __init__(self, store: FileStore | None) -> None:
        self.store = store

    async def upload(self, owner: str, purpose: str, filename: str, content: bytes | BinaryIO) -> dict:
        """A ``batch`` file (JSONL): ``content`` its bytes, or a file to read them from (an
        upload's spooled file), read, checked and stored in a worker thread, off the event
        loop. Raises 400 for another purpose or a file that is not UTF-8 text."""
        if purpose != "batch":
            raise invalid_request(f"purpose {purpose!r} is not served here: only 'batch' files are", "purpose")
        require(self.store)
        return await call(self, "_store_upload", owner, purpose, filename[:255] or "upload.jsonl", content,
                          bulk_work=True, owner=owner)

    def _store_upload(self, owner: str, purpose: str, filename: str, content: bytes | BinaryIO) -> dict:
        """Blocking: ``upload``'s store, a UTF-8-checked piece at a time (``batch_files``)."""
        source = io.BytesIO(content) if isinstance(content, bytes) else content
        return self.store.create(owner, f"file-{uuid.uuid4().hex}", purpose, filename, checked_utf8(source))

    async def file(self, owner: str, file_id: str) -> dict:
        found = await call(self.store, "get", owner, file_id) if is_stored_id(file_id) else None
        if found is None:
            raise not_found("file", file_id)
        return found

    async def file_content(self, owner: str, file_id: str) -> tuple[dict, AsyncIterator[bytes]]:
        """The file object and its bytes, read a piece at a time as they are taken (a file
        deleted meanwhile ends short of its ``bytes``). Raises 404."""
        found = await self.file(owner, file_id)

        async def pieces() -> AsyncIterator[bytes]:
            seq = 0
            while (piece := await call(self.store, "piece", file_id, seq)) is not None:
                yield piece
                seq += 1
        return found, pieces()

    async def list_files(self, owner: str, purpose: str | None, after: str | None, limit: int, order: str) -> dict:
        try:
            rows = await call(self.store, "page", owner, purpose, after, limit, order == "desc")
        except UnknownCursor:
            raise unknown_cursor(after or "", "the list of files") from None
        return list_object(rows, limit)

    async def delete_file(self, owner: str, file_id: str) -> dict:
        if not (is_stored_id(file_id) and await call(self.store, "delete", owner, file_id)):
            raise not_found("file", file_id)
        return {"id": file_id, "object": "file", "deleted": True}
