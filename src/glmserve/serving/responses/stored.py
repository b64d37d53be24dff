"""Stored ``/v1/responses`` (OpenAI's ``store``, ``previous_response_id``, ``background``), over
a ``ResponsesService`` that generates and a ``state.ResponseStore`` that keeps.

- ``store`` (default true when the server has a store): the response and the input items it
  was made from are kept (``--store-ttl``), readable by the API key that made it:
  ``GET /v1/responses/{id}``, ``.../input_items``, ``DELETE``.
- ``previous_response_id``: the stored response's input items and output items come before this
  request's ``input`` (its ``instructions`` are not carried over, as on OpenAI's API): the
  prompt extends the previous one, which the engines' prefix caches find again.
- ``background: true`` (needs ``store``): the answer is the response at once (``queued``); the
  run goes on without the connection (``background.BackgroundRuns``: its states, its events
  for a stream that resumes with ``GET /v1/responses/{id}?stream=true&starting_after=N``, its
  cancel, its heartbeat). A run whose heartbeat is ``LOST_AFTER_S`` old (its server died or was
  killed) reads as ``failed`` (``server_error``) from then on, on every server of the database.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from glmserve.engine.types import INTERACTIVE_PRIORITY
from glmserve.protocol.errors import APIError, ErrorResponse, invalid_request
from glmserve.protocol.responses import Response, ResponseEvent, ResponsesRequest
from glmserve.serving.responses.conversations import ConversationService
from glmserve.serving.items import is_stored_id, page, stored_items
from glmserve.serving.responses.service import ResponsesService
from glmserve.serving.responses.background import EVENTS_KEPT_S, TERMINAL, BackgroundRuns
from glmserve.state import ResponseStore, StoreFull, StoredResponse
from glmserve.state.tables import dumps
from glmserve.state.responses import RUNNING

log = logging.getLogger("glmserve.responses")

LOST_AFTER_S = 60.0  # a run whose heartbeat is this old lost its server: it reads as failed
LOST = ("the server running this background response stopped before it finished (it was restarted or "
        "failed); create the response again")


def not_found(response_id: str) -> APIError:
    """404, OpenAI's answer for a response id it does not have (or not for this key)."""
    return APIError(404, f"Response with id '{response_id}' not found.", "invalid_request_error", None, None)


class ResponseStorage:
    """The stored side of ``/v1/responses`` for one server (all its models). ``store``: where
    responses are kept (None: a stateless server, where ``store: true``, ``background`` and
    ``previous_response_id`` are 400s). Owners are opaque strings (the route passes the API
    key's digest); one owner never reads another's responses (a 404, as for a missing id)."""

    def __init__(self, store: ResponseStore | None, conversations: ConversationService | None = None) -> None:
        self.store = store
        self.conversations = conversations or ConversationService(None)
        self.runs = BackgroundRuns(store)

    # --- creating -------------------------------------------------------------------------

    async def _resolved(self, req: ResponsesRequest, owner: str) -> tuple[ResponsesRequest, _Keep]:
        """``(request to generate, what to keep of its answer)``: the request's input after the
        previous response's or the conversation's items. Raises 400s for what cannot be stored
        or continued, 404 for a conversation that is not there."""
        store = req.store if req.store is not None else self.store is not None
        if self.store is None:
            for name, given in (("store", req.store), ("background", req.background),
                                ("previous_response_id", req.previous_response_id),
                                ("conversation", req.conversation)):
                if given:
                    raise invalid_request(f"{name} needs stored responses, which this server does not keep", name)
        if req.background and not store:
            raise invalid_request("background responses must be stored: leave store out or set it to true",
                                  "background")
        if req.previous_response_id and req.conversation:
            raise invalid_request("previous_response_id and conversation cannot both be given", "conversation")
        new = stored_items(req.input)
        before: list[dict] = []
        if req.previous_response_id:
            previous = await self._lookup(req.previous_response_id, owner)
            if previous is None:
                raise invalid_request(f"Previous response with id '{req.previous_response_id}' not found.",
                                      "previous_response_id")
            if previous.body.get("status") not in ("completed", "incomplete"):
                raise invalid_request(f"Previous response with id '{req.previous_response_id}' is "
                                      f"{previous.body.get('status')}: only a finished response can be continued",
                                      "previous_response_id")
            before = previous.input_items + previous.body.get("output", [])
        elif req.conversation:
            before = await self.conversations.items(req.conversation, owner)
        if store:
            await asyncio.to_thread(self._check_fits, before + new)
        generate = req.model_copy(update={"input": before + new, "store": store})
        return generate, _Keep(self, owner, before + new, new, store, req.conversation)

    def _check_fits(self, items: list[dict]) -> None:
        """A 400 ``store_full`` when the input items a stored response would keep (a continued
        response's whole history, copied into each response of a chain) are more than one API
        key's share of the store: it could never be kept within it."""
        quota = self.store.quota
        bound = min((b for b in (quota.share, quota.max_bytes) if b is not None), default=None)
        if bound is not None and (size := len(dumps(items).encode())) > bound:
            raise invalid_request(f"this response would keep {size} bytes of input items (those of the responses it "
                                  f"continues included), more than an API key's share of the store ({bound} bytes): "
                                  "start a new chain, or send store: false", "input", "store_full")

    async def create(self, service: ResponsesService, req: ResponsesRequest, owner: str,
                     priority: int = INTERACTIVE_PRIORITY,
                     encoded: bool = False) -> Response | AsyncIterator[ResponseEvent | ErrorResponse | str]:
        """``service.create`` with the request's stored context, its answer kept (stored when
        ``store``, added to its conversation): a ``Response``, or its events (kept once the
        last has passed). Not for ``background`` (``start``). Raises ``APIError`` before
        anything is generated. ``priority``: the engine requests' (batch lines: ``BATCH_PRIORITY``);
        ``encoded``: ``ResponsesService.create``'s."""
        generate, keep = await self._resolved(req, owner)
        result = await service.create(generate, priority, encoded)
        if not keep.needed:
            return result
        if isinstance(result, Response):
            body = result.model_dump()
            await keep(body)
            return result if body["store"] == result.store else result.model_copy(update={"store": body["store"]})
        return _Storing(result, keep)

    async def start(self, service: ResponsesService, req: ResponsesRequest, owner: str,
                    release: Callable[[], None]) -> Response | AsyncIterator[ResponseEvent | ErrorResponse]:
        """Start a background run of ``req`` (``background: true``), which holds the model
        (``release`` is called when it ends): the ``queued`` response, or with ``stream`` the
        run's events as they come (a client that leaves does not stop the run)."""
        try:
            generate, keep = await self._resolved(req, owner)
            events = await service.create(generate.model_copy(update={"stream": True}))
            try:
                created = await anext(events)  # response.created: the response, before generation
                body = {**created.response, "status": "queued"}
                try:
                    await keep.put(body)
                except StoreFull as exc:  # a run would be kept past its key's share: refused before it runs
                    raise invalid_request(str(exc), None, "store_full") from None
            except BaseException:
                await events.aclose()
                raise
        except BaseException:
            release()
            raise
        self.runs.launch(owner, created, body, events, keep, keep.put, release)
        if not req.stream:
            return Response.model_validate(body)
        return await self.follow(body["id"], owner, -1)

    async def follow(self, response_id: str, owner: str, starting_after: int) -> AsyncIterator[ResponseEvent]:
        """The events of the background run ``response_id`` after sequence number
        ``starting_after``, then each new one until the run ends. Raises 404 (no such response
        for ``owner``) or 400 (not a background run of this server, or no longer kept)."""
        follow = self.runs.follow(response_id, owner, starting_after)
        if follow is None:
            stored = await self.get(response_id, owner)
            raise invalid_request(f"the events of response '{stored['id']}' are not kept on this server: only a "
                                  "background response streams again, on the server that ran it, until "
                                  f"{EVENTS_KEPT_S:.0f} s after it ended", "stream")
        return follow

    # --- reading --------------------------------------------------------------------------

    def _need_store(self) -> ResponseStore:
        if self.store is None:
            raise APIError(404, "responses are not stored on this server", "invalid_request_error", None, None)
        return self.store

    async def _lookup(self, response_id: str, owner: str) -> StoredResponse | None:
        if not is_stored_id(response_id):  # not one of ours (and no odd bytes reach the database)
            return None
        store = self._need_store()
        stored = await asyncio.to_thread(store.get, owner, response_id)
        if stored is None or not self._lost(response_id, stored):
            return stored
        failed = {**stored.body, "status": "failed", "error": {"code": "server_error", "message": LOST}}
        if await asyncio.to_thread(store.fail_lost, owner, stored, failed):
            log.warning("background response %s lost its server (no heartbeat for %.0f s): stored as failed",
                        response_id, LOST_AFTER_S)
            return StoredResponse(failed, stored.input_items)
        return await asyncio.to_thread(store.get, owner, response_id)  # it changed meanwhile

    def _lost(self, response_id: str, stored: StoredResponse) -> bool:
        """A background run that no server runs any more: running by its status, not here, and
        no heartbeat for ``LOST_AFTER_S``."""
        return (stored.body.get("status") in RUNNING and not self.runs.running(response_id)
                and (stored.heartbeat_at is None
                     or (stored.read_at or time.time()) - stored.heartbeat_at > LOST_AFTER_S))

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
        if self.runs.running(response_id, owner):
            await self.cancel(response_id, owner)
        if not is_stored_id(response_id) or not await asyncio.to_thread(self._need_store().delete, owner,
                                                                         response_id):
            raise not_found(response_id)
        return {"id": response_id, "object": "response", "deleted": True}

    async def input_items(self, response_id: str, owner: str, after: str | None, limit: int,
                          order: str) -> dict:
        """OpenAI's list of the response's input items (``order`` ``asc``/``desc``, the page of
        ``limit`` after the item ``after``). Raises 404, or 400 for an ``after`` not in it."""
        items = (await self._stored(response_id, owner)).input_items
        return page(items, after, limit, order, f"response '{response_id}'")

    async def cancel(self, response_id: str, owner: str) -> dict:
        """Cancel a background run: its engine request is aborted and it is stored as
        ``cancelled``; a finished one is returned as it is. Raises 404, or 400 for a response
        that was not made in the background."""
        body = await self.get(response_id, owner)
        if not body.get("background"):
            raise invalid_request("Only background responses can be cancelled.", None)
        if await self.runs.cancel(response_id):
            return await self.get(response_id, owner)
        if body.get("status") in TERMINAL:
            return body
        # queued or in progress but not running here: a run lost to a restart, or on another
        # replica, which may end it meanwhile: only a run still going is stored cancelled
        cancelled = {**body, "status": "cancelled"}
        if await asyncio.to_thread(self.store.cancel, owner, cancelled):
            return cancelled
        return await self.get(response_id, owner)

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

class _Keep:
    """What is kept of one response: ``put(body)`` stores a state of it (when ``store``);
    calling it with the last state also adds the request's ``new`` items and the output to its
    ``conversation`` (a finished response's only)."""

    def __init__(self, storage: ResponseStorage, owner: str, items: list[dict], new: list[dict], store: bool,
                 conversation: str | None) -> None:
        self.storage, self.owner, self.items, self.new = storage, owner, items, new
        self.store, self.conversation = store, conversation

    @property
    def needed(self) -> bool:
        return self.store or self.conversation is not None

    async def put(self, body: dict) -> bool:
        """Store this state of the response; False when a background run was cancelled or
        deleted meanwhile (from another replica: the stored ``cancelled`` stays)."""
        if not self.store:
            return True
        background = bool(body.get("background"))
        # a background run's later states are written over its stored one only: a response
        # deleted meanwhile (from another replica too) stays deleted
        first = background and body.get("status") == "queued"
        return await asyncio.to_thread(self.storage.store.put, self.owner, body, self.items,
                                       background and body.get("status") != "cancelled", background and not first,
                                       first)

    async def __call__(self, body: dict) -> None:
        """Keep the final ``body``. A store that fails (the database unreachable or full, the
        key's share) does not throw the finished answer away: it is logged, and ``body`` is
        answered with ``store`` false (it cannot be read back or continued), as a response the
        client did not ask to store."""
        try:
            if not await self.put(body):
                return
            if self.conversation is not None and body.get("status") in ("completed", "incomplete"):
                await self.storage.conversations.append(self.conversation, self.owner,
                                                        self.new + body.get("output", []))
        except Exception:  # noqa: BLE001 (any failure of the store: the answer is still given)
            log.exception("storing response %s failed: it is answered with store false", body.get("id"))
            body["store"] = False


class _Storing:
    """A response's events, passed on; the final response (``response.completed`` or
    ``.incomplete``) is kept (``_Keep``) before it is passed on. ``aclose`` closes the source
    (aborting the engine request)."""

    def __init__(self, source: AsyncIterator[ResponseEvent | ErrorResponse],
                 keep: Callable[[dict], Awaitable[None]]) -> None:
        self._source, self._keep = source, keep

    def __aiter__(self) -> _Storing:
        return self

    async def __anext__(self) -> ResponseEvent | ErrorResponse:
        event = await anext(self._source)
        if isinstance(event, ResponseEvent) and event.type in ("response.completed", "response.incomplete"):
            await self._keep(event.response)
        return event

    async def aclose(self) -> None:
        await self._source.aclose()
