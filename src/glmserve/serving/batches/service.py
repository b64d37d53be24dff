"""Batches over the state database: OpenAI's Batch API (``/v1/files`` of JSONL request lines,
``/v1/batches``) and Anthropic's Message Batches (``/v1/messages/batches``, requests inline), on
one machinery: ``BatchService`` makes, reads, cancels and finishes batches;
``serving/batch_runner.BatchRunner`` (one per server process) runs their lines through
``dispatch`` (the same handlers as the HTTP routes: ``server/batch_dispatch.py``).

Priority: each line runs at the engines' ``BATCH_PRIORITY`` (``serving/generation/request_scope.py``: the
llama_cpp engine pauses batch sequences while an interactive one has work, and gives it their
slots). The runner takes the engines' full batch size (the largest ``max_num_seqs`` of the
models loaded), and starts no new line while an interactive generation request is in flight or
left less than ``batch_runner.QUIET_S`` ago (``Activity``), so that bursts of interactive requests do not
share the event loop and the engine with new lines' set-up and prefill. Durability: ``state/batches.py`` (a line's result is
stored with its done mark; lines of a dead runner are claimed again after ``batch_runner.LEASE_S``).

Shapes follow OpenAI's batch object and output lines (``{"id", "custom_id", "response":
{"status_code", "request_id", "body"}, "error"}``; non-200 lines go to the error file) and
Anthropic's message batch and result lines (``succeeded``/``errored``/``canceled``)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import datetime
import io
import logging
import os
import re
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Collection
from typing import Any, BinaryIO

from glmserve.protocol.errors import APIError, invalid_request
from glmserve.serving.batches.files import OUTPUT_FILES, checked_utf8, jsonl, lines_of, output_pieces, parse_lines
from glmserve.serving.items import is_stored_id, list_object, unknown_cursor
from glmserve.state import BatchStore, Build, FileStore, LostBuild, StoreFull, UnknownCursor
from glmserve.state.batches import FINALIZING

log = logging.getLogger("glmserve.batches")

COMPLETION_WINDOW_S = 24 * 3600
BULK_NICE = 10  # the bulk workers' niceness: below the engine's threads on a busy CPU


def _lower_priority() -> None:
    """A bulk worker's start: this thread runs at ``BULK_NICE`` (Linux sets a thread's own
    niceness; elsewhere the call fails and nothing changes)."""
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BULK_NICE)


# uploads read and checked, batch files parsed, output files written: seconds of CPU for a big
# file, in threads that give way to the engine's (a stream's next token) on a busy machine
_BULK = concurrent.futures.ThreadPoolExecutor(2, "glmserve-bulk", initializer=_lower_priority)
ENDED = ("completed", "failed", "cancelled", "expired", "ended")  # a batch's final statuses (body_status)
PIECE_LINES = 500  # lines written per piece of a batch's files (one short transaction each)
BUILD_LEASE_S = 60.0  # a build with no piece written for this long lost its server: taken over



def _not_found(kind: str, object_id: str) -> APIError:
    return APIError(404, f"No {kind} found with id '{object_id}'.", "invalid_request_error", None, None)


def _rfc3339(seconds: float | None) -> str | None:
    if seconds is None:
        return None
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).isoformat().replace("+00:00", "Z")


class BatchService:
    """The batch routes' handlers over ``batches`` and ``files``; None: a stateless server,
    where every route is a 404. ``wake``: called when a batch is made (the runner looks for
    work at once)."""

    def __init__(self, batches: BatchStore | None, files: FileStore | None) -> None:
        self.batches, self.files = batches, files
        self.wake: Callable[[], None] = lambda: None

    async def _call(self, store: Any, method: str, *args: Any, bulk: bool = False) -> Any:
        """``store.method(*args)`` in a worker thread (``bulk``: a bulk worker, ``_bulk``); a 404
        on a stateless server, a 400 ``store_full`` for ``StoreFull``."""
        if store is None or self.files is None:
            raise APIError(404, "files and batches are not stored on this server", "invalid_request_error", None,
                           None)
        try:
            if bulk:
                return await _bulk(getattr(store, method), *args)
            return await asyncio.to_thread(getattr(store, method), *args)
        except StoreFull as exc:
            raise invalid_request(str(exc), None, "store_full") from None

    # --- files ----------------------------------------------------------------------------

    async def upload(self, owner: str, purpose: str, filename: str, content: bytes | BinaryIO) -> dict:
        """A ``batch`` file (JSONL): ``content`` its bytes, or a file to read them from (an
        upload's spooled file), read, checked and stored in a worker thread, off the event
        loop. Raises 400 for another purpose or a file that is not UTF-8 text."""
        if purpose != "batch":
            raise invalid_request(f"purpose {purpose!r} is not served here: only 'batch' files are", "purpose")
        return await self._call(self, "_store_upload", owner, purpose, filename[:255] or "upload.jsonl", content,
                                bulk=True)

    def _store_upload(self, owner: str, purpose: str, filename: str, content: bytes | BinaryIO) -> dict:
        """Blocking: ``upload``'s store, a UTF-8-checked piece at a time (``batch_files``)."""
        source = io.BytesIO(content) if isinstance(content, bytes) else content
        return self.files.create(owner, f"file-{uuid.uuid4().hex}", purpose, filename, checked_utf8(source))

    async def file(self, owner: str, file_id: str) -> dict:
        found = await self._call(self.files, "get", owner, file_id) if is_stored_id(file_id) else None
        if found is None:
            raise _not_found("file", file_id)
        return found

    async def file_content(self, owner: str, file_id: str) -> tuple[dict, AsyncIterator[bytes]]:
        """The file object and its bytes, read a piece at a time as they are taken (a file
        deleted meanwhile ends short of its ``bytes``). Raises 404."""
        found = await self.file(owner, file_id)

        async def pieces() -> AsyncIterator[bytes]:
            seq = 0
            while (piece := await self._call(self.files, "piece", file_id, seq)) is not None:
                yield piece
                seq += 1
        return found, pieces()

    async def list_files(self, owner: str, purpose: str | None, after: str | None, limit: int, order: str) -> dict:
        try:
            rows = await self._call(self.files, "page", owner, purpose, after, limit, order == "desc")
        except UnknownCursor:
            raise unknown_cursor(after or "", "the list of files") from None
        return list_object(rows, limit)

    async def delete_file(self, owner: str, file_id: str) -> dict:
        if not (is_stored_id(file_id) and await self._call(self.files, "delete", owner, file_id)):
            raise _not_found("file", file_id)
        return {"id": file_id, "object": "file", "deleted": True}

    # --- OpenAI batches -------------------------------------------------------------------

    async def create(self, owner: str, input_file_id: str, endpoint: str, completion_window: str,
                     metadata: dict[str, str] | None, endpoints: Collection[str]) -> dict:
        """A batch of the file's lines: ``in_progress``, or ``failed`` with OpenAI's ``errors``
        (line numbers from 1) when a line is not a request for ``endpoint``, one of
        ``endpoints`` (the server's, ``server/endpoints.ENDPOINTS``). Raises 400 for an endpoint
        or window not served, 404 for a file that is not there."""
        if endpoint not in endpoints:
            raise invalid_request(f"endpoint {endpoint!r} is not served in batches (one of "
                                  f"{', '.join(endpoints)})", "endpoint")
        if completion_window != "24h":
            raise invalid_request("completion_window must be '24h'", "completion_window")
        await self.file(owner, input_file_id)
        lines, errors = await _bulk(self._parse_file, input_file_id, endpoint)  # ~0.1 s per 8 MiB: off the loop
        now = time.time()
        body = {"id": f"batch_{uuid.uuid4().hex}", "object": "batch", "endpoint": endpoint, "errors": None,
                "input_file_id": input_file_id, "completion_window": completion_window,
                "status": "in_progress", "output_file_id": None, "error_file_id": None, "created_at": int(now),
                "in_progress_at": int(now), "expires_at": int(now + COMPLETION_WINDOW_S), "finalizing_at": None,
                "completed_at": None, "failed_at": None, "expired_at": None, "cancelling_at": None,
                "cancelled_at": None, "request_counts": {"total": len(lines), "completed": 0, "failed": 0},
                "metadata": metadata or {}}
        if errors:
            body.update(status="failed", in_progress_at=None, failed_at=int(now),
                        errors={"object": "list", "data": errors[:100]}, request_counts={
                            "total": 0, "completed": 0, "failed": 0})
            lines = []
        await self._call(self.batches, "create", owner, body["id"], "openai", body, lines, now + COMPLETION_WINDOW_S)
        self.wake()
        return body

    async def get(self, owner: str, batch_id: str, api: str = "openai") -> dict:
        body = await self._call(self.batches, "get", owner, batch_id, api) if is_stored_id(batch_id) else None
        if body is None:
            raise _not_found("batch", batch_id)
        if body["status"] in ("in_progress", "cancelling"):
            total, done, failed, _ = await self._call(self.batches, "counts", batch_id)
            body = _with_counts(body, total, done, failed)
        return body

    async def list(self, owner: str, after: str | None, limit: int, api: str = "openai") -> dict:
        try:
            rows = await self._call(self.batches, "page", owner, api, after, limit)
        except UnknownCursor:
            raise unknown_cursor(after or "", "the list of batches") from None
        return list_object(rows, limit)

    async def cancel(self, owner: str, batch_id: str, api: str = "openai") -> dict:
        """Stop a batch: no new line starts, running ones finish (``cancelling``), then it is
        ``cancelled`` with the results so far. A finished batch is returned as it ended."""
        body = await self.get(owner, batch_id, api)
        if body_status(body) not in ("in_progress",):
            if api == "openai" and body["status"] in ("failed", "completed", "expired", "cancelled"):
                raise invalid_request(f"Cannot cancel a batch with status '{body['status']}'.", None)
            return body
        now = time.time()
        body = _cancelling(body, now)
        await self._call(self.batches, "update", batch_id, body, ("in_progress",))
        await self.finish_if_done(batch_id)
        return await self.get(owner, batch_id, api)

    async def delete(self, owner: str, batch_id: str, api: str = "openai") -> dict:
        """Delete an ended batch with its lines, and (OpenAI) the output and error files made
        for it (its input file is the client's: it stays). Raises 404, or 400 before it ended."""
        body = await self.get(owner, batch_id, api)
        if body_status(body) not in ENDED:
            raise invalid_request("a batch can be deleted once it has ended: cancel it first", None)
        await self._call(self.batches, "delete", owner, batch_id, api)
        for key in ("output_file_id", "error_file_id"):
            if body.get(key):
                await self._call(self.files, "delete", owner, body[key])
        if api == "anthropic":
            return {"id": batch_id, "type": "message_batch_deleted"}
        return {"id": batch_id, "object": "batch", "deleted": True}

    def _parse_file(self, file_id: str, endpoint: str) -> tuple[list[tuple[str, dict]], list[dict]]:
        """Blocking: the batch file's requests and error objects, parsed as its pieces are read."""
        return parse_lines(lines_of(self.files.pieces(file_id)), endpoint)

    # --- Anthropic message batches --------------------------------------------------------

    async def create_messages(self, owner: str, requests: list[dict[str, Any]]) -> dict:
        """An Anthropic message batch of ``requests`` (``{"custom_id", "params"}``). Raises
        400 naming the request that is not one."""
        lines, seen = [], set()
        for i, item in enumerate(requests):
            custom_id, params = item.get("custom_id"), item.get("params")
            if not isinstance(custom_id, str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", custom_id):
                raise invalid_request("custom_id must be 1 to 64 letters, digits, '-' or '_'",
                                      f"requests.{i}.custom_id")
            if custom_id in seen:
                raise invalid_request(f"custom_id {custom_id!r} is given twice", f"requests.{i}.custom_id")
            if not isinstance(params, dict):
                raise invalid_request("params must be a Messages request", f"requests.{i}.params")
            if params.get("stream"):
                raise invalid_request("stream is not served in a batch", f"requests.{i}.params.stream")
            seen.add(custom_id)
            lines.append((custom_id, params))
        now = time.time()
        body = {"id": f"msgbatch_{uuid.uuid4().hex}", "type": "message_batch", "processing_status": "in_progress",
                "status": "in_progress", "request_counts": {"processing": len(lines), "succeeded": 0, "errored": 0,
                                                            "canceled": 0, "expired": 0},
                "ended_at": None, "created_at": _rfc3339(now), "expires_at": _rfc3339(now + COMPLETION_WINDOW_S),
                "cancel_initiated_at": None, "archived_at": None, "results_url": None}
        await self._call(self.batches, "create", owner, body["id"], "anthropic", body, lines,
                         now + COMPLETION_WINDOW_S)
        self.wake()
        return body

    async def message_results(self, owner: str, batch_id: str) -> AsyncIterator[bytes]:
        """The ended batch's results as Anthropic's JSONL, made a page of lines at a time as
        they are taken. Raises 404, or 400 before it ended."""
        body = await self.get(owner, batch_id, "anthropic")
        if body["processing_status"] != "ended":
            raise invalid_request(f"batch '{batch_id}' has not ended yet: its results are not ready", None)
        not_run = {"type": "expired"} if body["status"] == "expired" else {"type": "canceled"}

        async def pages() -> AsyncIterator[bytes]:
            after = -1
            while (page := await self._call(self, "_results_page", batch_id, after, not_run))[0]:
                yield page[0]
                after = page[1]
        return pages()

    def _results_page(self, batch_id: str, after: int, not_run: dict) -> tuple[bytes, int]:
        """Blocking (a worker thread: encoding 1000 results is milliseconds of CPU, kept off the
        event loop): a page of Anthropic result lines after line ``after`` and the page's last
        line (``b""`` past the end)."""
        def result(line) -> dict:
            if line.status_code is None:
                return not_run
            if line.status_code == 200:
                return {"type": "succeeded", "message": line.result}
            return {"type": "errored", "error": line.result}

        page = self.batches.results_page(batch_id, after)
        if not page:
            return b"", after
        return b"".join(jsonl({"custom_id": line.custom_id, "result": result(line)} for line in page)), page[-1].line_no

    # --- finishing ------------------------------------------------------------------------

    async def finish_if_done(self, batch_id: str, expire: bool = False) -> None:
        """If no line of the batch is left to run (or, cancelling, none is running), write its
        results and end it: ``completed`` (OpenAI: output and error files), ``cancelled``, or
        ``failed`` when a result did not fit the store (``stop_full``); Anthropic's ``ended``.
        ``expire``: its window has ended: end it now, ``expired``, its lines not run listed as
        such (OpenAI's error file: ``batch_expired``; Anthropic's results: ``expired``). An
        OpenAI batch is ``finalizing`` while its files are written (``BatchStore.begin_build``),
        and one whose builder stopped is taken over here."""
        body = await self._call(self.batches, "body", batch_id)
        if body is None:
            return
        if body["status"] == FINALIZING:
            taken = await self._call(self.batches, "take_build", batch_id, BUILD_LEASE_S)
            if taken is not None:
                await self._build(batch_id, body, *taken)
            return
        if body["status"] not in ("in_progress", "cancelling"):
            return
        total, done, failed, in_flight = await self._call(self.batches, "counts", batch_id)
        if not expire and (body["status"] == "in_progress" and done < total
                           or body["status"] == "cancelling" and in_flight):
            return
        now = time.time()
        status = "expired" if expire else "failed" if body.get("errors") else \
            "cancelled" if body["status"] == "cancelling" else "completed"
        if body.get("type") == "message_batch":
            ended = _with_counts({**body, "status": status}, total, done, failed)
            ended.update(status="ended" if status != "expired" else status, processing_status="ended",
                         ended_at=_rfc3339(now))
            if await self._call(self.batches, "update", batch_id, ended, ("in_progress", "cancelling")):
                log.info("batch %s %s: %d of %d lines run, %d failed", batch_id, ended["status"], done, total, failed)
            return
        build = Build(status, [total, done, failed], {key: [f"file-{uuid.uuid4().hex}", 0, 0] for key in OUTPUT_FILES})
        finalizing = {**_with_counts(body, total, done, failed), "status": FINALIZING, "finalizing_at": int(now)}
        seen = await self._call(self.batches, "begin_build", batch_id, finalizing, build, ("in_progress", "cancelling"))
        if seen is not None:
            await self._build(batch_id, finalizing, seen, build)

    async def _build(self, batch_id: str, body: dict, seen: str, build: Build) -> None:
        owner = await self._call(self.batches, "owner_of", batch_id)
        try:
            ended = await self._call(self, "_write_files", batch_id, owner, body, seen, build, bulk=True)
        except LostBuild:
            log.warning("batch %s: another server took over writing its files", batch_id)
            return
        if ended is not None:
            total, done, failed = build.counts
            log.info("batch %s %s: %d of %d lines run, %d failed", batch_id, ended["status"], done, total, failed)

    def _write_files(self, batch_id: str, owner: str, body: dict, seen: str, build: Build) -> dict | None:
        """Blocking (a bulk worker: a batch of 50,000 lines makes files of many MiB): the
        ending batch's output and error files written from its lines, a page of lines a piece
        (``BatchStore.write_piece``: one short transaction each, the lines written deleted),
        then the batch ended with the files that are not empty (``end_build``). The ended
        batch, or None when another server ended it. Raises ``LostBuild``."""
        while page := self.batches.results_page(batch_id, build.after, PIECE_LINES):
            pieces = output_pieces(page, build.status)
            for key in OUTPUT_FILES:
                build.files[key][1] += len(pieces[key])
                build.files[key][2] += sum(len(piece) for piece in pieces[key])
            build.after = page[-1].line_no
            seen = self.batches.write_piece(batch_id, owner, seen, build, pieces, build.after)
        now = int(time.time())
        ended = {**body, **{key: file_id for key, (file_id, _, size) in build.files.items() if size},
                 "status": build.status, f"{build.status}_at": now}
        files = [(file_id, f"{batch_id}_{key.split('_')[0]}.jsonl", size)
                 for key, (file_id, _, size) in build.files.items() if size]
        return ended if self.batches.end_build(batch_id, owner, seen, ended, files) else None

    async def stop_full(self, batch_id: str, message: str) -> None:
        """A line's result did not fit the store (``StoreFull``): no new line of the batch
        starts, and it ends ``failed`` (Anthropic: ``ended``) with ``message`` in its
        ``errors`` once the lines running end; what it stored is kept (the line is in its error
        file as a ``store_full`` error)."""
        body = await self._call(self.batches, "body", batch_id)
        if body is None or body["status"] != "in_progress":
            return
        body = _cancelling(body, time.time())
        if body.get("type") != "message_batch":
            body["errors"] = {"object": "list", "data": [{"code": "store_full", "message": message, "param": None,
                                                          "line": None}]}
        if await self._call(self.batches, "update", batch_id, body, ("in_progress",)):
            log.warning("batch %s stopped: %s", batch_id, message)


async def _bulk(fn, *args):
    """``fn(*args)`` on a bulk worker (``_BULK``), awaited."""
    return await asyncio.get_running_loop().run_in_executor(_BULK, fn, *args)


def body_status(body: dict) -> str:
    """A batch's status in its own API's words (Anthropic: ``processing_status``)."""
    return body.get("processing_status") or body["status"]


def _cancelling(body: dict, now: float) -> dict:
    if body.get("type") == "message_batch":
        return {**body, "status": "cancelling", "processing_status": "canceling", "cancel_initiated_at": _rfc3339(now)}
    return {**body, "status": "cancelling", "cancelling_at": int(now)}


def _with_counts(body: dict, total: int, done: int, failed: int) -> dict:
    if body.get("type") == "message_batch":
        expired = body["status"] == "expired"
        ended = body.get("processing_status") in ("ended",) or body["status"] in ("cancelling", "ended", "expired")
        return {**body, "request_counts": {
            "processing": 0 if ended else total - done, "succeeded": done - failed, "errored": failed,
            "canceled": total - done if ended and not expired else 0, "expired": total - done if expired else 0}}
    return {**body, "request_counts": {"total": total, "completed": done - failed, "failed": failed}}
