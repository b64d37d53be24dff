"""A store that fails after the answer was generated (``serving/responses/stored.py``): the
finished answer is still given, with ``store`` false, whole and streamed, and the failure is
logged; nothing is kept."""

from __future__ import annotations

import asyncio
import logging

import sqlalchemy as sa

from glmserve.protocol.responses import Response, ResponseEvent, ResponsesRequest
from glmserve.serving.responses.stored import ResponseStorage
from glmserve.state import ResponseStore
from glmserve.state.database import open_database


def _finished(store: bool) -> Response:
    return Response(id="resp_1", created_at=1, status="completed", model="glm", tools=[], tool_choice="auto",
                    parallel_tool_calls=True, text={"format": {"type": "text"}}, store=store,
                    output=[{"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                             "content": [{"type": "output_text", "text": "Four.", "annotations": []}]}])


class _Service:
    """Answers every request with one finished response, whole or as its last event."""

    def __init__(self, stream: bool) -> None:
        self.stream = stream

    async def create(self, req: ResponsesRequest, priority: int, encoded: bool):
        answer = _finished(bool(req.store))
        if not self.stream:
            return answer

        async def events():
            yield ResponseEvent(type="response.completed", sequence_number=0, response=answer.model_dump())
        return events()


def test_a_failed_store_gives_the_answer_with_store_false(tmp_path, monkeypatch, caplog):
    store = ResponseStore(open_database(f"sqlite:///{tmp_path / 'state.db'}"), 100.0, 1 << 20)

    def broken(*args, **kwargs):
        raise sa.exc.OperationalError("INSERT", {}, Exception("disk I/O error"))

    monkeypatch.setattr(store, "put", broken)
    storage = ResponseStorage(store)
    req = ResponsesRequest(model="glm", input="What is two plus two?", store=True)

    async def main():
        whole = await storage.create(_Service(stream=False), req, "k")
        events = [event async for event in await storage.create(_Service(stream=True), req, "k")]
        return whole, events

    with caplog.at_level(logging.ERROR, "glmserve.responses"):
        whole, events = asyncio.run(main())
    assert isinstance(whole, Response) and whole.store is False and whole.model_dump()["output"][0]["content"][0]["text"] == "Four."
    assert [e.type for e in events] == ["response.completed"] and events[0].response["store"] is False
    assert events[0].response["output"][0]["content"][0]["text"] == "Four."
    assert caplog.text.count("storing response resp_1 failed") == 2
    monkeypatch.undo()
    assert store.get("k", "resp_1") is None
