"""Stored ``/v1/responses`` (OpenAI's ``store``, ``previous_response_id``, ``background``), over
a ``ResponsesService`` that generates and a ``state.ResponseStore`` that keeps.

- ``store`` (default true when the server has a store): the response and the input items it
  was made from are kept (``--store-ttl``), readable by the API key that made it:
  ``GET /v1/responses/{id}``, ``.../input_items``, ``DELETE``.
- ``previous_response_id``: the stored response's input items and output items come before this
  request's ``input`` (its ``instructions`` are not carried over, as on OpenAI's API): the
  prompt extends the previous one, which the engines' prefix caches find again.
- ``background: true`` (needs ``store``): the answer is the response at once (``queued``); the
  run goes on without the connection, its states stored as they change (``in_progress``,
  then ``completed``/``incomplete``/``failed``, or ``cancelled`` by ``POST .../cancel``, which
  aborts it in the engine). With ``stream: true`` the events stream as they come, and
  ``GET /v1/responses/{id}?stream=true&starting_after=N`` streams them again from after
  sequence number N, on the server that runs it, while it runs and for ``EVENTS_KEPT_S``
  after.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from glmserve.protocol.errors import APIError, ErrorResponse, invalid_request
from glmserve.protocol.responses import Response, ResponseEvent, ResponsesRequest
from glmserve.serving.responses import ResponsesService
from glmserve.state import ResponseStore, StoredResponse

log = logging.getLogger("glmserve.responses")

EVENTS_KEPT_S = 600.0  # how long a finished background run's events stay for resumed streams
MAX_RUNS_KEPT = 256  # finished runs whose events are kept, at most
TERMINAL = ("completed", "incomplete", "failed", "cancelled")
_ID = re.compile(r"[A-Za-z0-9_-]{1,80}")  # what an id this server makes can look like
_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}


def not_found(response_id: str) -> APIError:
    """404, OpenAI's answer for a response id it does not have (or not for this key)."""
    return APIError(404, f"Response with id '{response_id}' not found.", "invalid_request_error", None, None)


def input_items_of(req: ResponsesRequest) -> list[dict[str, Any]]:
    """``req.input`` as stored items, each with an ``id``: a string is one user message; a
    message's string content becomes one ``input_text`` part (``output_text`` for the
    assistant), as OpenAI lists input items."""
    raw = [{"type": "message", "role": "user", "content": req.input}] if isinstance(req.input, str) else req.input
    items = []
    for item in raw:
        item = dict(item)
        kind = item.setdefault("type", "message")
        if kind == "message" and isinstance(item.get("content"), str):
            part = "output_text" if item.get("role") == "assistant" else "input_text"
            item["content"] = [{"type": part, "text": item["content"]}]
        item.setdefault("id", f"{_PREFIX.get(kind, 'item')}_{uuid.uuid4().hex}")
        items.append(item)
    return items


@dataclass
class _Run:
    """A background run: its task, the events so far (for streams that join late), and who
    waits for the next one."""

    owner: str
    events: list[ResponseEvent] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task | None = None
    finished_at: float | None = None


class ResponseStorage:
    """The stored side of ``/v1/responses`` for one server (all its models). ``store``: where
    responses are kept (None: a stateless server, where ``store: true``, ``background`` and
    ``previous_response_id`` are 400s). Owners are opaque strings (the route passes the API
    key's digest); one owner never reads another's responses (a 404, as for a missing id)."""

    def __init__(self, store: ResponseStore | None) -> None:
        self.store = store
        self._runs: OrderedDict[str, _Run] = OrderedDict()

    # --- creating -------------------------------------------------------------------------

    async def _resolved(self, req: ResponsesRequest, owner: str) -> tuple[ResponsesRequest, list[dict], bool]:
        """``(request to generate, its whole input as stored items, whether to store)``.
        Raises 400s for what cannot be stored or continued."""
        store = req.store if req.store is not None else self.store is not None
        if self.store is None:
            for name, given in (("store", req.store), ("background", req.background),
                                ("previous_response_id", req.previous_response_id)):
                if given:
                    raise invalid_request(f"{name} needs stored responses, which this server does not keep", name)
        if req.background and not store:
            raise invalid_request("background responses must be stored: leave store out or set it to true",
                                  "background")
        items = input_items_of(req)
        if req.previous_response_id:
            previous = await self._lookup(req.previous_response_id, owner)
            if previous is None:
                raise invalid_request(f"Previous response with id '{req.previous_response_id}' not found.",
                                      "previous_response_id")
            if previous.body.get("status") not in ("completed", "incomplete"):
                raise invalid_request(f"Previous response with id '{req.previous_response_id}' is "
                                      f"{previous.body.get('status')}: only a finished response can be continued",
                                      "previous_response_id")
            items = previous.input_items + previous.body.get("output", []) + items
        generate = req.model_copy(update={"input": items, "store": store})
        return generate, items, store

    async def create(self, service: ResponsesService, req: ResponsesRequest,
                     owner: str) -> Response | AsyncIterator[ResponseEvent | ErrorResponse]:
        """``service.create`` with the request's stored context, its result stored when
        ``store``: a ``Response``, or its events (stored once the last has passed). Not for
        ``background`` (``start``). Raises ``APIError`` before anything is generated."""
        generate, items, store = await self._resolved(req, owner)
        result = await service.create(generate)
        if not store:
            return result
        if isinstance(result, Response):
            await asyncio.to_thread(self.store.put, owner, result.model_dump(), items)
            return result
        return _Storing(result, lambda body: self.store.put(owner, body, items))

    async def start(self, service: ResponsesService, req: ResponsesRequest, owner: str,
                    release: Callable[[], None]) -> Response | AsyncIterator[ResponseEvent | ErrorResponse]:
        """Start a background run of ``req`` (``background: true``), which holds the model
        (``release`` is called when it ends): the ``queued`` response, or with ``stream`` the
        run's events as they come (a client that leaves does not stop the run)."""
        try:
            generate, items, _ = await self._resolved(req, owner)
            events = await service.create(generate.model_copy(update={"stream": True}))
            try:
                created = await anext(events)  # response.created: the response, before generation
                body = {**created.response, "status": "queued"}
                await asyncio.to_thread(self.store.put, owner, body, items)
            except BaseException:
                await events.aclose()
                raise
        except BaseException:
            release()
            raise
        run = _Run(owner)
        self._runs[body["id"]] = run
        self._record(run, created.model_copy(update={"response": body}))
        run.task = asyncio.create_task(self._run(run, body, events, items, release))
        if not req.stream:
            return Response.model_validate(body)
        return await self.follow(body["id"], owner, -1)

    @staticmethod
    def _record(run: _Run, event: ResponseEvent) -> None:
        run.events.append(event)
        run.changed.set()
        run.changed = asyncio.Event()

    async def _run(self, run: _Run, body: dict, events: AsyncIterator[ResponseEvent | ErrorResponse],
                   items: list[dict], release: Callable[[], None]) -> None:
        put = self.store.put
        try:
            async for event in events:
                if event.type == "response.in_progress":
                    body = {**body, "status": "in_progress"}
                    await asyncio.to_thread(put, run.owner, body, items)
                elif event.type in ("response.completed", "response.incomplete"):
                    body = event.response
                elif event.type == "error":
                    body = {**body, "status": "failed", "error": {"code": event.code or "server_error",
                                                                  "message": event.message}}
                self._record(run, event)  # an error event is followed by response.failed
                if event.type == "error":
                    self._record(run, ResponseEvent(type="response.failed", sequence_number=event.sequence_number + 1,
                                                    response=body))
        except asyncio.CancelledError:
            body = {**body, "status": "cancelled"}
            self._record(run, ResponseEvent(type="response.cancelled",
                                            sequence_number=len(run.events), response=body))
        except Exception as exc:  # noqa: BLE001 (the run is its own request: it must end stored)
            log.exception("background response %s failed", body["id"])
            body = {**body, "status": "failed", "error": {"code": "server_error", "message": str(exc)}}
            self._record(run, ResponseEvent(type="response.failed", sequence_number=len(run.events),
                                            response=body))
        finally:
            with contextlib.suppress(Exception):
                await events.aclose()
            release()
            try:
                await asyncio.to_thread(put, run.owner, body, items)
            except Exception:  # noqa: BLE001
                log.exception("background response %s: its last state was not stored", body["id"])
            run.finished_at = time.monotonic()
            run.changed.set()
            self._forget_old_runs()

    def _forget_old_runs(self) -> None:
        now = time.monotonic()
        finished = [rid for rid, run in self._runs.items() if run.finished_at is not None]
        for rid in finished[:max(0, len(finished) - MAX_RUNS_KEPT)]:
            del self._runs[rid]
        for rid in finished:
            run = self._runs.get(rid)
            if run is not None and now - run.finished_at > EVENTS_KEPT_S:
                del self._runs[rid]

    async def follow(self, response_id: str, owner: str, starting_after: int) -> AsyncIterator[ResponseEvent]:
        """The events of the background run ``response_id`` after sequence number
        ``starting_after``, then each new one until the run ends. Raises 404 (no such response
        for ``owner``) or 400 (not a background run of this server, or no longer kept)."""
        run = self._runs.get(response_id)
        if run is None or run.owner != owner:
            stored = await self.get(response_id, owner)
            raise invalid_request(f"the events of response '{stored['id']}' are not kept on this server: only a "
                                  "background response streams again, on the server that ran it, until "
                                  f"{EVENTS_KEPT_S:.0f} s after it ended", "stream")
        return _Follow(run, starting_after)

    # --- reading --------------------------------------------------------------------------

    def _need_store(self) -> ResponseStore:
        if self.store is None:
            raise APIError(404, "responses are not stored on this server", "invalid_request_error", None, None)
        return self.store

    async def _lookup(self, response_id: str, owner: str) -> StoredResponse | None:
        if not _ID.fullmatch(response_id):  # not one of ours (and no odd bytes reach the database)
            return None
        return await asyncio.to_thread(self._need_store().get, owner, response_id)

    async def _stored(self, response_id: str, owner: str) -> StoredResponse:
        stored = await self._lookup(response_id, owner)
        if stored is None:
            raise not_found(response_id)
        return stored

    async def get(self, response_id: str, owner: str) -> dict:
        """The stored response object. Raises 404."""
        return (await self._stored(response_id, owner)).body

    async def delete(self, response_id: str, owner: str) -> dict:
        """Delete it (a background run still going is cancelled first); OpenAI's deletion
        object. Raises 404."""
        run = self._runs.get(response_id)
        if run is not None and run.owner == owner and run.task is not None and not run.task.done():
            await self.cancel(response_id, owner)
        if not _ID.fullmatch(response_id) or not await asyncio.to_thread(self._need_store().delete, owner,
                                                                         response_id):
            raise not_found(response_id)
        return {"id": response_id, "object": "response", "deleted": True}

    async def input_items(self, response_id: str, owner: str, after: str | None, limit: int,
                          order: str) -> dict:
        """OpenAI's list of the response's input items (``order`` ``asc``/``desc``, the page of
        ``limit`` after the item ``after``). Raises 404, or 400 for an ``after`` not in it."""
        items = list((await self._stored(response_id, owner)).input_items)
        if order == "desc":
            items.reverse()
        if after is not None:
            ids = [item.get("id") for item in items]
            if after not in ids:
                raise invalid_request(f"item '{after}' is not an input item of response '{response_id}'", "after")
            items = items[ids.index(after) + 1:]
        page = items[:limit]
        return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                "last_id": page[-1]["id"] if page else None, "has_more": len(items) > limit}

    async def cancel(self, response_id: str, owner: str) -> dict:
        """Cancel a background run: its engine request is aborted and it is stored as
        ``cancelled``; a finished one is returned as it is. Raises 404, or 400 for a response
        that was not made in the background."""
        body = await self.get(response_id, owner)
        if not body.get("background"):
            raise invalid_request("Only background responses can be cancelled.", None)
        run = self._runs.get(response_id)
        if run is not None and run.task is not None and not run.task.done():
            run.task.cancel()
            await asyncio.gather(run.task, return_exceptions=True)
            return await self.get(response_id, owner)
        if body.get("status") in TERMINAL:
            return body
        # queued or in progress but not running here: a run lost to a restart, or on another replica
        body = {**body, "status": "cancelled"}
        stored = await self._stored(response_id, owner)
        await asyncio.to_thread(self.store.put, owner, body, stored.input_items)
        return body

    # --- upkeep ---------------------------------------------------------------------------

    async def purge_forever(self, interval_s: float) -> None:
        """Delete expired responses every ``interval_s`` seconds (the server's lifetime)."""
        while True:
            try:
                gone = await asyncio.to_thread(self._need_store().purge)
                if gone:
                    log.info("deleted %d expired stored responses", gone)
            except Exception:  # noqa: BLE001 (a database hiccup must not end the task)
                log.exception("purging expired responses failed")
            await asyncio.sleep(interval_s)

    async def close(self) -> None:
        """Cancel the background runs still going (stored as ``cancelled``)."""
        running = [run.task for run in self._runs.values() if run.task is not None and not run.task.done()]
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)


class _Storing:
    """A response's events, passed on; the final response (``response.completed`` or
    ``.incomplete``) is stored with ``put`` before it is passed on. ``aclose`` closes the
    source (aborting the engine request)."""

    def __init__(self, source: AsyncIterator[ResponseEvent | ErrorResponse], put: Callable[[dict], None]) -> None:
        self._source, self._put = source, put

    def __aiter__(self) -> _Storing:
        return self

    async def __anext__(self) -> ResponseEvent | ErrorResponse:
        event = await anext(self._source)
        if isinstance(event, ResponseEvent) and event.type in ("response.completed", "response.incomplete"):
            await asyncio.to_thread(self._put, event.response)
        return event

    async def aclose(self) -> None:
        await self._source.aclose()


class _Follow:
    """The events of a background run after ``after``, then each new one until it ends.
    Closing it leaves the run going."""

    def __init__(self, run: _Run, after: int) -> None:
        self._run, self._next = run, max(0, after + 1)  # a run's events are numbered by their index

    def __aiter__(self) -> _Follow:
        return self

    async def __anext__(self) -> ResponseEvent:
        run = self._run
        while True:
            if self._next < len(run.events):
                self._next += 1
                return run.events[self._next - 1]
            if run.finished_at is not None:
                raise StopAsyncIteration
            await run.changed.wait()

    async def aclose(self) -> None:
        return None
