"""Anthropic's Message Batches (``/v1/messages/batches``, requests inline): made and their
results read here, run, read, cancelled and ended on the one machinery of ``BatchService``
(``api="anthropic"``). Shapes follow Anthropic's message batch and result lines
(``succeeded``/``errored``/``canceled``/``expired``)."""

from __future__ import annotations

import datetime
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from glmserve.protocol.errors import invalid_request
from glmserve.serving.batches.calls import COMPLETION_WINDOW_S, call
from glmserve.serving.batches.files import jsonl
from glmserve.state import BatchStore


class Batches(Protocol):
    """What a message batch needs of ``service.BatchService``: its store, its ``wake`` of the
    runner, and ``get`` of a batch."""

    batches: BatchStore | None
    wake: Callable[[], None]

    async def get(self, owner: str, batch_id: str, api: str = "openai") -> dict: ...


def rfc3339(seconds: float | None) -> str | None:
    """``seconds`` since the epoch as Anthropic's timestamps write it (RFC 3339, UTC, ``Z``)."""
    if seconds is None:
        return None
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).isoformat().replace("+00:00", "Z")


class MessageBatchService:
    """The message batch routes' own handlers (``create``, ``results``) over ``service``, whose
    ``get``/``list``/``cancel``/``delete`` take ``api="anthropic"`` for the rest."""

    def __init__(self, service: Batches) -> None:
        self.service = service

    async def create(self, owner: str, requests: list[dict[str, Any]]) -> dict:
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
                "ended_at": None, "created_at": rfc3339(now), "expires_at": rfc3339(now + COMPLETION_WINDOW_S),
                "cancel_initiated_at": None, "archived_at": None, "results_url": None}
        await call(self.service.batches, "create", owner, body["id"], "anthropic", body, lines,
                   now + COMPLETION_WINDOW_S)
        self.service.wake()
        return body

    async def results(self, owner: str, batch_id: str) -> AsyncIterator[bytes]:
        """The ended batch's results as Anthropic's JSONL, made a page of lines at a time as
        they are taken. Raises 404, or 400 before it ended."""
        body = await self.service.get(owner, batch_id, "anthropic")
        if body["processing_status"] != "ended":
            raise invalid_request(f"batch '{batch_id}' has not ended yet: its results are not ready", None)
        not_run = {"type": "expired"} if body["status"] == "expired" else {"type": "canceled"}

        async def pages() -> AsyncIterator[bytes]:
            after = -1
            while (page := await call(self, "_results_page", batch_id, after, not_run))[0]:
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

        page = self.service.batches.results_page(batch_id, after)
        if not page:
            return b"", after
        return b"".join(jsonl({"custom_id": line.custom_id, "result": result(line)} for line in page)), page[-1].line_no
