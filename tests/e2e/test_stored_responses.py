"""Stored responses through the ``openai`` SDK, on both state databases: SQLite (a file in
``--state-dir``, the default) and PostgreSQL (``--database-url``, a cluster the tests start).

store, retrieve, delete, input items, a three-turn ``previous_response_id`` chain whose later
turns find the earlier ones in the prefix cache, background runs polled, cancelled (the engine
request ends) and streamed again from a sequence number, each API key seeing only its own
responses, and the responses outliving a restart."""

from __future__ import annotations

import json
import re
import tempfile
import time

import httpx
import openai
import pytest

from glmserve.testing import RemoteServer
from tests.e2e.keyed_state import (GREEDY, KEY, OTHER_KEY, client, metric, model, server,  # noqa: F401 (fixtures)
                                   wait_until)


LONG = "Write a long story about a dragon."


def _running(server: RemoteServer) -> float:
    return metric(server, "glmserve:num_requests_running")


def test_store_retrieve_list_delete(client, model):
    response = client.responses.create(model=model, input="Say hi.", max_output_tokens=8)
    assert response.store is True and response.status in ("completed", "incomplete")
    got = client.responses.retrieve(response.id)
    assert (got.id, got.output_text, got.usage.output_tokens) == (response.id, response.output_text,
                                                                 response.usage.output_tokens)
    items = client.responses.input_items.list(response.id)
    assert [(i.type, i.role, i.content[0].text) for i in items.data] == [("message", "user", "Say hi.")]
    assert items.data[0].id.startswith("msg_")
    client.responses.delete(response.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(response.id)


def test_store_false_keeps_nothing(client, model):
    response = client.responses.create(model=model, input="Say hi.", max_output_tokens=4, store=False)
    assert response.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)


def test_input_items_pages_in_both_orders(client, model):
    turns = [{"role": "user", "content": f"Number {i}."} for i in range(5)]
    response = client.responses.create(model=model, input=turns, max_output_tokens=2)
    ascending = client.responses.input_items.list(response.id, order="asc", limit=100).data
    assert [i.content[0].text for i in ascending] == [t["content"] for t in turns]
    page = client.responses.input_items.list(response.id, order="desc", limit=2)
    assert [i.content[0].text for i in page.data] == ["Number 4.", "Number 3."] and page.has_more
    rest = client.responses.input_items.list(response.id, order="desc", limit=10, after=page.last_id)
    assert [i.content[0].text for i in rest.data] == ["Number 2.", "Number 1.", "Number 0."]
    assert not rest.has_more
    every = list(client.responses.input_items.list(response.id, order="asc", limit=2))  # the SDK pages on
    assert [i.id for i in every] == [i.id for i in ascending]


def test_three_turn_chain_reads_the_earlier_turns_from_the_prefix_cache(client, model):
    first = client.responses.create(model=model, input="My name is Ada. Say hi.", max_output_tokens=16)
    second = client.responses.create(model=model, input="What is my name?", previous_response_id=first.id,
                                     max_output_tokens=16)
    third = client.responses.create(model=model, input="Say it again.", previous_response_id=second.id,
                                    max_output_tokens=16)
    assert (second.previous_response_id, third.previous_response_id) == (first.id, second.id)
    # each turn's prompt extends the last one's: at least that whole prompt is found cached
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens
    assert third.usage.input_tokens_details.cached_tokens >= second.usage.input_tokens
    assert third.usage.input_tokens > second.usage.input_tokens + second.usage.output_tokens
    items = client.responses.input_items.list(third.id, order="asc").data
    assert [(i.type, i.role) for i in items] == [("message", "user"), ("message", "assistant")] * 2 + [
        ("message", "user")]
    assert items[1].content[0].text == first.output_text and items[3].content[0].text == second.output_text
    # the same conversation sent whole gives the same greedy answer
    whole = client.responses.create(model=model, input=[
        {"role": "user", "content": "My name is Ada. Say hi."}, {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "What is my name?"}], max_output_tokens=16, store=False)
    assert whole.output_text == second.output_text


def test_a_chain_continues_a_function_call(client, model):
    tools = [{"type": "function", "name": "get_time", "description": "The time in a city.",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
    call = client.responses.create(model=model, input="What time is it in Paris?", tools=tools,
                                   tool_choice="required", max_output_tokens=60)
    calls = [i for i in call.output if i.type == "function_call"]
    assert calls
    answer = client.responses.create(model=model, previous_response_id=call.id, tools=tools, max_output_tokens=8,
                                     input=[{"type": "function_call_output", "call_id": c.call_id,
                                             "output": "12:00"} for c in calls])
    assert answer.status in ("completed", "incomplete")
    # the call must be answered: continuing without its output is OpenAI's 400
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model=model, previous_response_id=call.id, input="Hi", max_output_tokens=2)


def test_unknown_previous_response_is_a_400(client, model):
    for bad in ("resp_nope", "resp_\x00", "x" * 500):
        with pytest.raises(openai.BadRequestError) as err:
            client.responses.create(model=model, input="Hi", previous_response_id=bad, max_output_tokens=2)
        assert err.value.body["param"] == "previous_response_id"


def test_background_response_is_polled_to_its_end(client, model):
    queued = client.responses.create(model=model, input="Say hi.", background=True, max_output_tokens=16)
    assert (queued.status, queued.background, queued.output) == ("queued", True, [])
    response = queued
    deadline = time.monotonic() + 120
    while response.status in ("queued", "in_progress") and time.monotonic() < deadline:
        time.sleep(0.2)
        response = client.responses.retrieve(queued.id)
    assert response.status in ("completed", "incomplete") and response.output_text
    assert response.usage.output_tokens > 0
    done = client.responses.cancel(queued.id)  # a finished run is returned as it ended
    assert done.status == response.status


def test_cancelled_background_response_stops_in_the_engine(server, client, model):
    run = client.responses.create(model=model, input=LONG, background=True, max_output_tokens=3000)
    wait_until(lambda: _running(server) >= 1)
    assert _running(server) == 1
    assert client.responses.retrieve(run.id).status in ("queued", "in_progress")
    aborted_before = server.log().count("aborted after")
    cancelled = client.responses.cancel(run.id)
    assert cancelled.status == "cancelled"
    # the engine drops the request at its next step: it says so, and stops running it
    wait_until(lambda: server.log().count("aborted after") > aborted_before and _running(server) == 0)
    generated = [int(n) for n in re.findall(r"aborted after (\d+)", server.log())[aborted_before:]]
    assert len(generated) == 1 and generated[0] < 3000
    assert _running(server) == 0
    assert client.responses.retrieve(run.id).status == "cancelled"
    with pytest.raises(openai.BadRequestError):  # only a background response can be cancelled
        client.responses.cancel(client.responses.create(model=model, input="Hi", max_output_tokens=2).id)


def test_a_background_run_deleted_on_another_server_stops_and_stays_deleted(state_backend, server, client, model):
    """A background response deleted through another server of the database while it runs:
    the server running it stops it, and its later states do not store it again (before, its
    end re-inserted it)."""
    other = RemoteServer("--api-key", KEY, *GREEDY, env=state_backend[1])
    try:
        run = client.responses.create(model=model, input=LONG, background=True, max_output_tokens=3000)
        wait_until(lambda: _running(server) >= 1)
        assert _running(server) == 1
        aborted_before = server.log().count("aborted after")
        other.client(api_key=KEY).responses.delete(run.id)
        # stopped in its engine (the abort's log line), not ended by itself
        wait_until(lambda: server.log().count("aborted after") > aborted_before and _running(server) == 0)
        assert server.log().count("aborted after") == aborted_before + 1 and _running(server) == 0
        for _ in range(30):  # its last state is written (or not) just after the engine is done with it
            with pytest.raises(openai.NotFoundError):
                client.responses.retrieve(run.id)
            time.sleep(0.1)
    finally:
        other.stop()


def test_a_run_cancelled_on_another_server_of_the_database_stops(state_backend, server, client, model):
    """Two servers on one database (replicas): a background run cancelled through the other
    one is stopped in its own engine, and stays cancelled."""
    other = RemoteServer("--api-key", KEY, *GREEDY, env=state_backend[1])
    try:
        run = client.responses.create(model=model, input=LONG, background=True, max_output_tokens=3000)
        wait_until(lambda: _running(server) >= 1)
        aborted_before = server.log().count("aborted after")
        assert other.client(api_key=KEY).responses.cancel(run.id).status == "cancelled"
        wait_until(lambda: server.log().count("aborted after") > aborted_before and _running(server) == 0)
        assert server.log().count("aborted after") == aborted_before + 1 and _running(server) == 0
        assert client.responses.retrieve(run.id).status == "cancelled"
    finally:
        other.stop()


def test_background_stream_resumes_after_a_sequence_number(client, model):
    stream = client.responses.create(model=model, input="Tell me a story.", background=True, stream=True,
                                     max_output_tokens=40)
    first = []
    for event in stream:
        first.append(event)
        if len(first) == 6:
            break
    stream.close()  # the client leaves; the run goes on
    response_id = first[0].response.id
    assert first[0].type == "response.created" and first[0].response.status == "queued"
    resumed = list(client.responses.retrieve(response_id, stream=True, starting_after=first[-1].sequence_number))
    assert [e.sequence_number for e in resumed] == list(range(6, 6 + len(resumed)))
    assert resumed[-1].type in ("response.completed", "response.incomplete")
    text = "".join(e.delta for e in first + resumed if e.type == "response.output_text.delta")
    assert text == resumed[-1].response.output_text == client.responses.retrieve(response_id).output_text


def test_a_plain_response_does_not_stream_again(client, model):
    response = client.responses.create(model=model, input="Hi", max_output_tokens=2)
    with pytest.raises(openai.BadRequestError):
        list(client.responses.retrieve(response.id, stream=True))


def test_each_key_sees_only_its_own_responses(server, client, model):
    other = server.client(api_key=OTHER_KEY)
    mine = client.responses.create(model=model, input="Hi", max_output_tokens=2)
    with pytest.raises(openai.NotFoundError):
        other.responses.retrieve(mine.id)
    with pytest.raises(openai.NotFoundError):
        other.responses.input_items.list(mine.id)
    with pytest.raises(openai.NotFoundError):
        other.responses.delete(mine.id)
    with pytest.raises(openai.NotFoundError):
        other.responses.cancel(mine.id)
    with pytest.raises(openai.BadRequestError):
        other.responses.create(model=model, input="Hi", previous_response_id=mine.id, max_output_tokens=2)
    assert client.responses.retrieve(mine.id).id == mine.id  # still there for its owner
    with pytest.raises(openai.AuthenticationError):
        server.client(api_key="key-c").responses.retrieve(mine.id)


def test_responses_outlive_a_restart(state_backend, model):
    env = dict(state_backend[1])
    if state_backend[0] == "sqlite":
        env["GLMSERVE_STATE_DIR"] = tempfile.mkdtemp(prefix="glmserve-state-")
    first = RemoteServer("--api-key", KEY, *GREEDY, env=env)
    try:
        before = first.client(api_key=KEY).responses.create(model=model, input="My name is Ada.", max_output_tokens=8)
    finally:
        first.stop()
    second = RemoteServer("--api-key", KEY, *GREEDY, env=env)
    try:
        client = second.client(api_key=KEY)
        assert client.responses.retrieve(before.id).output_text == before.output_text
        after = client.responses.create(model=model, input="What is my name?", previous_response_id=before.id,
                                        max_output_tokens=8)
        assert [i.content[0].text for i in client.responses.input_items.list(after.id, order="asc").data] == [
            "My name is Ada.", before.output_text, "What is my name?"]
    finally:
        second.stop()


def test_raw_routes_answer_in_openai_shapes(server, client, model):
    headers = {"Authorization": f"Bearer {KEY}"}
    response = client.responses.create(model=model, input="Hi", max_output_tokens=2)
    deleted = httpx.delete(f"{server.url}/v1/responses/{response.id}", headers=headers)
    assert (deleted.status_code, deleted.json()) == (200, {"id": response.id, "object": "response", "deleted": True})
    for method, path, status in (("GET", "/v1/responses/resp_x/input_items?limit=0", 400),
                                 ("GET", "/v1/responses/resp_x/input_items?order=up", 400),
                                 ("GET", "/v1/responses/resp_x?stream=true&starting_after=-5", 400),
                                 ("GET", "/v1/responses/%00", 404), ("POST", "/v1/responses/resp_x/cancel", 404)):
        answer = httpx.request(method, f"{server.url}{path}", headers=headers)
        assert answer.status_code == status, (path, answer.text)
        assert set(json.loads(answer.text)["error"]) >= {"message", "type", "param", "code"}


def test_a_conversation_with_items_added_listed_and_answered(client, model):
    conversation = client.conversations.create(
        items=[{"type": "message", "role": "user", "content": "My name is Ada."}], metadata={"topic": "names"})
    assert conversation.id.startswith("conv_") and conversation.metadata == {"topic": "names"}
    added = client.conversations.items.create(conversation.id, items=[
        {"type": "message", "role": "assistant", "content": "Hello Ada."}])
    assert [i.content[0].text for i in added.data] == ["Hello Ada."]
    response = client.responses.create(model=model, input="What is my name?", conversation=conversation.id,
                                       max_output_tokens=8)
    assert response.conversation.id == conversation.id
    whole = client.responses.create(model=model, max_output_tokens=8, store=False, input=[
        {"role": "user", "content": "My name is Ada."}, {"role": "assistant", "content": "Hello Ada."},
        {"role": "user", "content": "What is my name?"}])
    assert response.output_text == whole.output_text  # the conversation came before the input
    items = client.conversations.items.list(conversation.id, order="asc").data
    assert [(i.role, i.content[0].text) for i in items] == [
        ("user", "My name is Ada."), ("assistant", "Hello Ada."), ("user", "What is my name?"),
        ("assistant", response.output_text)]
    assert client.conversations.items.retrieve(items[1].id, conversation_id=conversation.id).id == items[1].id
    assert client.conversations.update(conversation.id, metadata={"topic": "x"}).metadata == {"topic": "x"}
    client.conversations.items.delete(items[0].id, conversation_id=conversation.id)
    assert len(client.conversations.items.list(conversation.id).data) == 3
    with pytest.raises(openai.NotFoundError):
        client.conversations.items.retrieve(items[0].id, conversation_id=conversation.id)
    assert client.conversations.delete(conversation.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.conversations.retrieve(conversation.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=model, input="Hi", conversation=conversation.id, max_output_tokens=2)


def test_a_conversation_belongs_to_its_key(server, client, model):
    other = server.client(api_key=OTHER_KEY)
    conversation = client.conversations.create()
    for call in (lambda: other.conversations.retrieve(conversation.id),
                 lambda: other.conversations.items.list(conversation.id),
                 lambda: other.conversations.items.create(conversation.id, items=[
                     {"type": "message", "role": "user", "content": "Hi"}]),
                 lambda: other.conversations.delete(conversation.id),
                 lambda: other.responses.create(model=model, input="Hi", conversation=conversation.id,
                                                max_output_tokens=2)):
        with pytest.raises(openai.NotFoundError):
            call()
    assert client.conversations.items.list(conversation.id).data == []


def test_conversation_requests_are_checked(client, model):
    conversation = client.conversations.create()
    with pytest.raises(openai.BadRequestError):  # OpenAI's limit: 20 items per request
        client.conversations.items.create(conversation.id, items=[
            {"type": "message", "role": "user", "content": "Hi"}] * 21)
    with pytest.raises(openai.BadRequestError) as err:
        client.conversations.items.create(conversation.id, items=[{"type": "computer_call"}])
    assert err.value.body["param"] == "items.0.type"
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=model, input="Hi", conversation=conversation.id, previous_response_id="resp_1")
    assert err.value.body["param"] == "conversation"
