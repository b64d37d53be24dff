"""Batches over the state database: OpenAI's Batch API (``/v1/files`` of JSONL request lines,
``/v1/batches``) and Anthropic's Message Batches (``/v1/messages/batches``, requests inline), on
one machinery: ``BatchService`` makes, reads, cancels and finishes batches (the files are
``file_service.FileService``'s, Anthropic's own routes ``message_batches.MessageBatchService``'s);
``serving/batch_runner.BatchRunner`` (one per server process) runs their lines through
``dispatch`` (the same handlers as the HTTP routes: ``server/batch_dispatch.py``).

Priority: each line runs at the engines' ``BATCH_PRIORITY`` (``serving/generation/request_scope.py``: the
llama_cpp engine pauses batch sequences while an interactive one has work, and gives it their
slots). The runner takes the engines' full batch size (the largest ``max_num_seqs`` of the
models loaded), and starts no new line while an interactive generation request is in flight or
left less than ``batch_runner.QUIET_S`` ago (``Activity``), so that bursts of interactive requests do not
share the event loop and the engine with new lines' set-up and prefill. Durability: ``state/batches.py`` (a line's result is
stored with its done mark; lines of a dead runner are claimed again after ``--batch-lease``).

Shapes follow OpenAI's batch object and output lines (``{"id", "custom_id", "response":
{"status_code", "request_id", "body"}, "error"}``; non-200 lines go to the error file) and
Anthropic's message batch and result lines (``succeeded``/``errored``/``canceled``)."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Collection

from glmserve.protocol.errors import invalid_request
from glmserve.serving.batches.calls import COMPLETION_WINDOW_S, bulk, call, not_found
from glmserve.serving.batches.file_service import FileService
from glmserve.serving.batches.files import OUTPUT_FILES, lines_of, output_pieces, parse_lines
from glmserve.serving.batches.message_batches import MessageBatchService, rfc3339
from glmserve.serving.items import is_stored_id, list_object, unknown_cursor
from glmserve.state import BatchStore, Build, FileStore, LostBuild, UnknownCursor
from glmserve.state.batches import FINALIZING

log = logging.getLogger("glmserve.batches")

ENDED = ("completed", "failed", "cancelled", "expired", "ended")  # a batch's final statuses (body_status)
PIECE_LINES = 500  # lines written per piece of a batch's files (one short transaction each)
BUILD_LEASE_S = 60.0  # a build with no piece written for this long lost its server: taken over


class BatchService:
    """The batch routes' handlers over ``batches`` and ``files``; None: a stateless server,
    where every route is a 404. ``wake``: called when a batch is made (the runner looks for
    work at once)."""

    def __init__(self, batches: BatchStore | None, files: FileStore | None) -> None:
        self.batches, self.files = batches, files
        self.file_service = FileService(files)  # /v1/files: a batch's input, output and error files
        self.message_batches = MessageBatchService(self)  # Anthropic's own routes
        self.wake: Callable[[], None] = lambda: None

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
        await self.file_service.file(owner, input_file_id)
        lines, errors = await bulk(self._parse_file, input_file_id, endpoint, owner=owner)  # ~0.1 s / 8 MiB
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
        await call(self.batches, "create", owner, body["id"], "openai", body, lines, now + COMPLETION_WINDOW_S)
        self.wake()
        return body

    async def get(self, owner: str, batch_id: str, api: str = "openai") -> dict:
        body = await call(self.batches, "get", owner, batch_id, api) if is_stored_id(batch_id) else None
        if body is None:
            raise not_found("batch", batch_id)
        if body["status"] in ("in_progress", "cancelling"):
            total, done, failed, _ = await call(self.batches, "counts", batch_id)
            body = _with_counts(body, total, done, failed)
        return body

    async def list(self, owner: str, after: str | None, limit: int, api: str = "openai") -> dict:
        try:
            rows = await call(self.batches, "page", owner, api, after, limit)
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
        await call(self.batches, "update", batch_id, body, ("in_progress",))
        await self.finish_if_done(batch_id)
        return await self.get(owner, batch_id, api)

    async def delete(self, owner: str, batch_id: str, api: str = "openai") -> dict:
        """Delete an ended batch with its lines, and (OpenAI) the output and error files made
        for it (its input file is the client's: it stays). Raises 404, or 400 before it ended."""
        body = await self.get(owner, batch_id, api)
        if body_status(body) not in ENDED:
            raise invalid_request("a batch can be deleted once it has ended: cancel it first", None)
        await call(self.batches, "delete", owner, batch_id, api)
        for key in ("output_file_id", "error_file_id"):
            if body.get(key):
                await call(self.files, "delete", owner, body[key])
        if api == "anthropic":
            return {"id": batch_id, "type": "message_batch_deleted"}
        return {"id": batch_id, "object": "batch", "deleted": True}

    def _parse_file(self, file_id: str, endpoint: str) -> tuple[list[tuple[str, dict]], list[dict]]:
        """Blocking: the batch file's requests and error objects, parsed as its pieces are read."""
        return parse_lines(lines_of(self.files.pieces(file_id)), endpoint)

    # --- finishing ------------------------------------------------------------------------

    async def finish_if_done(self, batch_id: str, expire: bool = False) -> None:
        """If no line of the batch is left to run (or, cancelling, none is running), write its
        results and end it: ``completed`` (OpenAI: output and error files), ``cancelled``, or
        ``failed`` when a result did not fit the store (``stop_full``); Anthropic's ``ended``.
        ``expire``: its window has ended: end it now, ``expired``, its lines not run listed as
        such (OpenAI's error file: ``batch_expired``; Anthropic's results: ``expired``). An
        OpenAI batch is ``finalizing`` while its files are written (``BatchStore.begin_build``),
        and one whose builder stopped is taken over here."""
        body = await call(self.batches, "body", batch_id)
        if body is None:
            return
        if body["status"] == FINALIZING:
            taken = await call(self.batches, "take_build", batch_id, BUILD_LEASE_S)
            if taken is not None:
                await self._build(batch_id, body, *taken)
            return
        if body["status"] not in ("in_progress", "cancelling"):
            return
        total, done, failed, in_flight = await call(self.batches, "counts", batch_id)
        if not expire and (body["status"] == "in_progress" and done < total
                           or body["status"] == "cancelling" and in_flight):
            return
        now = time.time()
        status = "expired" if expire else "failed" if body.get("errors") else \
            "cancelled" if body["status"] == "cancelling" else "completed"
        if body.get("type") == "message_batch":
            ended = _with_counts({**body, "status": status}, total, done, failed)
            ended.update(status="ended" if status != "expired" else status, processing_status="ended",
                         ended_at=rfc3339(now))
            if await call(self.batches, "update", batch_id, ended, ("in_progress", "cancelling")):
                log.info("batch %s %s: %d of %d lines run, %d failed", batch_id, ended["status"], done, total, failed)
            return
        build = Build(status, [total, done, failed], {key: [f"file-{uuid.uuid4().hex}", 0, 0] for key in OUTPUT_FILES})
        finalizing = {**_with_counts(body, total, done, failed), "status": FINALIZING, "finalizing_at": int(now)}
        seen = await call(self.batches, "begin_build", batch_id, finalizing, build, ("in_progress", "cancelling"))
        if seen is not None:
            await self._build(batch_id, finalizing, seen, build)

    async def _build(self, batch_id: str, body: dict, seen: str, build: Build) -> None:
        owner = await call(self.batches, "owner_of", batch_id)
        try:
            ended = await call(self, "_write_files", batch_id, owner, body, seen, build, bulk_work=True)
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
        body = await call(self.batches, "body", batch_id)
        if body is None or body["status"] != "in_progress":
            return
        body = _cancelling(body, time.time())
        if body.get("type") != "message_batch":
            body["errors"] = {"object": "list", "data": [{"code": "store_full", "message": message, "param": None,
                                                          "line": None}]}
        if await call(self.batches, "update", batch_id, body, ("in_progress",)):
            log.warning("batch %s stopped: %s", batch_id, message)


def body_status(body: dict) -> str:
    """A batch's status in its own API's words (Anthropic: ``processing_status``)."""
    return body.get("processing_status") or body["status"]


def _cancelling(body: dict, now: float) -> dict:
    if body.get("type") == "message_batch":
        return {**body, "status": "cancelling", "processing_status": "canceling", "cancel_initiated_at": rfc3339(now)}
    return {**body, "status": "cancelling", "cancelling_at": int(now)}


def _with_counts(body: dict, total: int, done: int, failed: int) -> dict:
    if body.get("type") == "message_batch":
        expired = body["status"] == "expired"
        ended = body.get("processing_status") in ("ended",) or body["status"] in ("cancelling", "ended", "expired")
        return {**body, "request_counts": {
            "processing": 0 if ended else total - done, "succeeded": done - failed, "errored": failed,
            "canceled": total - done if ended and not expired else 0, "expired": total - done if expired else 0}}
    return {**body, "request_counts": {"total": total, "completed": done - failed, "failed": failed}}
