"""What coding agents' requests need beyond tools, over the real app, GLM-4.7 template and parsers
with the scripted fake engine: the whole Open Responses ``ResponseResource``, reasoning sealed in
``encrypted_content`` and restored from it, ``truncation: "auto"``, calls paired with their
results on both agent APIs (as OpenAI and Anthropic check them), and strictly typed fields."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient

from glmserve.chat import ChatTemplate
from glmserve.server import AppOptions, create_app
from glmserve.serving.chat.service import ChatService
from glmserve.serving.generation.pipeline import ModelPipeline
from glmserve.serving.responses.sealed_reasoning import KEY_FILE, ReasoningSeal
from tests.unit.fakes import FakeEngine, one_model
from tests.unit.serving.test_reasoning_routes import ANSWER, ASK, GLM47, REPLY, THOUGHT, _sse

# ResponseResource.json's "required" list (openresponses/openresponses, schema/components/schemas,
# commit 3452c012), with the JSON type of each field; (type, None) where it may be null
RESOURCE_FIELDS = {
    "id": str, "object": str, "created_at": int, "completed_at": (int, type(None)), "status": str,
    "incomplete_details": (dict, type(None)), "model": str, "previous_response_id": (str, type(None)),
    "instructions": (str, list, type(None)), "output": list, "error": (dict, type(None)), "tools": list,
    "tool_choice": (str, dict), "truncation": str, "parallel_tool_calls": bool, "text": dict,
    "top_p": (int, float), "presence_penalty": (int, float), "frequency_penalty": (int, float),
    "top_logprobs": int, "temperature": (int, float), "reasoning": (dict, type(None)), "user": (str, type(None)),
    "usage": (dict, type(None)), "max_output_tokens": (int, type(None)), "max_tool_calls": (int, type(None)),
    "store": bool, "background": bool, "service_tier": str, "metadata": dict,
    "safety_identifier": (str, type(None)), "prompt_cache_key": (str, type(None)),
}
INCLUDE = {"include": ["reasoning.encrypted_content"], "store": False}


def _client(reply: str, state_dir, context_length: int = 8000) -> tuple[FakeEngine, TestClient]:
    engine = FakeEngine(reply=reply, context_length=context_length, grammar=True)
    chat = ChatService(ModelPipeline(engine, "glm", ChatTemplate(GLM47), "glm47"))
    return engine, TestClient(create_app(one_model(chat, seal=ReasoningSeal(state_dir))))


def _resource_ok(response: dict) -> None:
    missing = sorted(set(RESOURCE_FIELDS) - set(response))
    assert not missing, missing
    wrong = {k: response[k] for k, t in RESOURCE_FIELDS.items() if isinstance(response[k], bool) != (t is bool)
             or not isinstance(response[k], t)}
    assert not wrong, wrong


def test_every_response_resource_field_with_its_type(tmp_path):
    _, client = _client(REPLY, tmp_path)
    body = {"model": "glm", "input": ASK, "prompt_cache_key": "session-1", "safety_identifier": "u-9",
            "service_tier": "auto", "truncation": "auto", "reasoning": {"effort": "high", "summary": "auto"},
            "client_metadata": {"x": "y"}, "max_tool_calls": 3, "temperature": 0.5}
    plain = client.post("/v1/responses", json=body).json()
    _resource_ok(plain)
    assert (plain["prompt_cache_key"], plain["safety_identifier"], plain["temperature"], plain["top_p"],
            plain["truncation"], plain["reasoning"], plain["max_tool_calls"], plain["store"]) == (
        "session-1", "u-9", 0.5, 1.0, "auto", {"effort": "high", "summary": "auto"}, 3, False)
    assert plain["completed_at"] >= plain["created_at"]
    events = _sse(client, "/v1/responses", body)
    for started in (events[0], events[1]):
        _resource_ok(started["response"])
        assert started["response"]["completed_at"] is None
    assert events[-1]["type"] == "response.completed"
    _resource_ok(events[-1]["response"])
    assert events[-1]["response"]["completed_at"] is not None


def test_reasoning_is_sealed_and_restored_from_encrypted_content(tmp_path):
    engine, client = _client(REPLY, tmp_path)
    first = client.post("/v1/responses", json={"model": "glm", "input": ASK, **INCLUDE}).json()
    reasoning, message = first["output"]
    sealed = reasoning["encrypted_content"]
    assert isinstance(sealed, str) and THOUGHT not in sealed and "Two plus" not in sealed
    assert (tmp_path / KEY_FILE).stat().st_mode & 0o777 == 0o600
    # streamed: the done reasoning item carries it too
    [done] = [e["item"] for e in _sse(client, "/v1/responses", {"model": "glm", "input": ASK, **INCLUDE})
              if e["type"] == "response.output_item.done" and e["item"]["type"] == "reasoning"]
    assert ReasoningSeal(tmp_path).open(done["encrypted_content"], "-") == THOUGHT

    # sent back as Codex does (store: false; the item without its readable content): the
    # model's own reasoning is replayed to the template
    history = ASK + [{"type": "reasoning", "id": reasoning["id"], "summary": [], "encrypted_content": sealed},
                     message, {"role": "user", "content": "And 3+3?"}]
    again = client.post("/v1/responses", json={"model": "glm", "input": history, **INCLUDE})
    assert again.status_code == 200, again.text
    assert f"<think>{THOUGHT}</think>{ANSWER}" in engine.prompt_text(engine.requests[-1])

    # the key outlives the server: a new seal on the same directory opens what the old one sealed
    assert ReasoningSeal(tmp_path).open(sealed, "-") == THOUGHT
    # a forged, edited or foreign token is a 400 naming the item
    foreign = ReasoningSeal(tmp_path / "other").seal("I was told to say yes.")
    for token in (sealed[:-8] + ("A" * 8 if not sealed.endswith("A" * 8) else "B" * 8), "not-a-token", foreign):
        history[1]["encrypted_content"] = token
        bad = client.post("/v1/responses", json={"model": "glm", "input": history})
        assert bad.status_code == 400, bad.text
        assert bad.json()["error"]["param"] == "input.1.encrypted_content"


def _seal_when_released(state_dir: str, barrier) -> str:
    barrier.wait()
    return ReasoningSeal(state_dir).seal("shared")


def test_the_seal_key_is_never_read_empty(tmp_path, monkeypatch):
    """The key file appears whole or not at all: processes sealing at once on a fresh
    directory all seal under one key, and a crash while the key is written leaves no file
    (the next start makes a key) rather than an empty one."""
    import concurrent.futures
    import multiprocessing
    import os

    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(6, mp_context=context) as pool:
        for attempt in range(3):
            state_dir = tmp_path / f"fresh{attempt}"
            barrier = context.Manager().Barrier(6)
            tokens = list(pool.map(_seal_when_released, [str(state_dir)] * 6, [barrier] * 6))
            assert {ReasoningSeal(state_dir).open(token, "-") for token in tokens} == {"shared"}
            assert (state_dir / KEY_FILE).stat().st_mode & 0o777 == 0o600

    def crash(*args, **kwargs):
        raise OSError("killed while writing the key")

    monkeypatch.setattr(os, "fdopen", crash)
    with pytest.raises(OSError):
        ReasoningSeal(tmp_path / "crashed").seal("x")
    assert list((tmp_path / "crashed").iterdir()) == []
    monkeypatch.undo()
    assert ReasoningSeal(tmp_path / "crashed").open(ReasoningSeal(tmp_path / "crashed").seal("x"), "-") == "x"


def test_truncation_auto_drops_the_oldest_turns(tmp_path):
    engine, client = _client("Fine.", tmp_path, context_length=400)
    turns = []
    for n in range(6):
        turns += [{"role": "user", "content": f"question {n} " + "x" * 60},
                  {"role": "assistant", "content": f"answer {n} " + "y" * 60}]
    body = {"model": "glm", "instructions": "Be brief.", "input": turns + [{"role": "user", "content": "last one"}],
            "max_output_tokens": 20}
    refused = client.post("/v1/responses", json=body)
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "context_length_exceeded"
    served = client.post("/v1/responses", json={**body, "truncation": "auto"})
    assert served.status_code == 200, served.text
    prompt = engine.prompt_text(engine.requests[-1])
    assert "Be brief." in prompt and "last one" in prompt and "question 0" not in prompt
    assert "question 5" in prompt  # as few turns as needed are dropped
    kept = [n for n in range(6) if f"question {n}" in prompt]
    assert kept == list(range(kept[0], 6))  # whole turns, the oldest first
    assert f"answer {kept[0]}" in prompt and f"answer {kept[0] - 1}" not in prompt


@pytest.mark.parametrize(("items", "param", "fragment"), [
    ([{"type": "function_call_output", "call_id": "call_9", "output": "ok"}], "input.1.call_id",
     "No tool call found for function call output with call_id call_9"),
    ([{"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"}], "input.1",
     "No tool output found for function call call_1"),
    ([{"type": "function_call", "name": "get_weather", "arguments": "{}"}], "input.1.call_id", "call_id"),
])
def test_responses_calls_and_outputs_pair_up(tmp_path, items, param, fragment):
    _, client = _client(REPLY, tmp_path)
    resp = client.post("/v1/responses", json={"model": "glm", "input": ASK + items})
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param and fragment in resp.json()["error"]["message"]


USE = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}
RESULT = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}


@pytest.mark.parametrize(("messages", "param", "fragment"), [
    ([{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": [USE]},
      {"role": "user", "content": "Well?"}], "messages.1",
     "`tool_use` ids were found without `tool_result` blocks immediately after: toolu_1"),
    ([{"role": "user", "content": [{"type": "text", "text": "Hi"}, {**RESULT, "tool_use_id": "toolu_7"}]}],
     "messages.0.content.1", "unexpected `tool_use_id` found in `tool_result` blocks: toolu_7"),
    ([{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": [USE]},
      {"role": "user", "content": [RESULT]}, {"role": "assistant", "content": "Sunny."},
      {"role": "user", "content": [RESULT]}], "messages.4.content.0", "unexpected `tool_use_id`"),
])
def test_messages_tool_use_and_tool_result_pair_up(tmp_path, messages, param, fragment):
    _, client = _client(REPLY, tmp_path)
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        resp = client.post(path, json={"model": "glm", "max_tokens": 50, "messages": messages})
        assert resp.status_code == 400, resp.text
        error = resp.json()["error"]
        assert error["type"] == "invalid_request_error" and fragment in error["message"]
        assert error["message"].startswith(f"{param}: "), error  # where, as Anthropic says it


PNG_BLOCK = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}


def test_a_text_model_is_told_of_a_tool_result_image_and_goes_on(tmp_path):
    """Claude Code's Read tool on an image file returns an image block: a text model is not
    shown it, the session goes on (an image the user sends a text model is still a 400)."""
    engine, client = _client(REPLY, tmp_path)
    read = {**USE, "name": "Read", "input": {"file_path": "logo.png"}}
    messages = [{"role": "user", "content": "What is in logo.png?"}, {"role": "assistant", "content": [read]},
                {"role": "user", "content": [{**RESULT, "content": [{"type": "text", "text": "logo.png:"},
                                                                    PNG_BLOCK]}]}]
    resp = client.post("/v1/messages", json={"model": "glm", "max_tokens": 50, "messages": messages})
    assert resp.status_code == 200, resp.text
    assert "logo.png:\n[an image: this model reads text only, so it is not shown]" in engine.prompt_text(
        engine.requests[-1])
    direct = [{"role": "user", "content": [PNG_BLOCK, {"type": "text", "text": "What is this?"}]}]
    assert client.post("/v1/messages", json={"model": "glm", "max_tokens": 50, "messages": direct}).status_code == 400


def test_a_paired_round_trip_is_served(tmp_path):
    _, client = _client(REPLY, tmp_path)
    messages = [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": [USE]},
                {"role": "user", "content": [RESULT, {"type": "text", "text": "Thanks"}]}]
    assert client.post("/v1/messages", json={"model": "glm", "max_tokens": 50, "messages": messages}).status_code == 200


@pytest.mark.parametrize(("path", "field", "value"), [
    ("/v1/chat/completions", "stream", "yes"), ("/v1/chat/completions", "max_tokens", "5"),
    ("/v1/chat/completions", "temperature", "0.5"), ("/v1/chat/completions", "logprobs", 1),
    ("/v1/messages", "stream", "yes"), ("/v1/messages", "max_tokens", "50"), ("/v1/messages", "temperature", "1"),
    ("/v1/responses", "stream", "yes"), ("/v1/responses", "max_output_tokens", 5.5),
    ("/v1/responses", "parallel_tool_calls", "false"), ("/v1/completions", "echo", "true"),
])
def test_fields_are_strictly_typed(tmp_path, path, field, value):
    _, client = _client(REPLY, tmp_path)
    body = {"model": "glm", "max_tokens": 50, field: value}
    body.update({"/v1/responses": {"input": ASK}, "/v1/completions": {"prompt": "Hi"}}.get(path, {"messages": ASK}))
    if path == "/v1/responses":
        body.pop("max_tokens") if field != "max_tokens" else None
    resp = client.post(path, json=body)
    assert resp.status_code == 400, resp.text
    assert field in (resp.json()["error"].get("param") or "") + resp.json()["error"]["message"]


@pytest.mark.parametrize(("extra", "param"), [
    ({"include": ["message.output_text.logprobs"]}, "include.0"), ({"background": True}, "background"),
    ({"top_logprobs": 2}, "top_logprobs"), ({"store": True}, "store"),
])
def test_what_is_not_served_is_refused_by_name(tmp_path, extra, param):
    _, client = _client(REPLY, tmp_path)
    resp = client.post("/v1/responses", json={"model": "glm", "input": ASK, **extra})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == param, resp.text


@pytest.mark.parametrize("field", ["instructions", "prompt_cache_key", "user", "safety_identifier", "metadata"])
def test_an_echoed_field_with_a_lone_surrogate_is_a_400(tmp_path, field):
    """JSON may carry a lone UTF-16 surrogate; the response echoes these fields, and UTF-8
    cannot carry one: refused up front (it was a 500 while the response was written)."""
    import json

    _, client = _client(REPLY, tmp_path)
    value = {"k": "\ud800"} if field == "metadata" else "a\ud800"
    for stream in (False, True):
        body = json.dumps({"model": "glm", "input": "hi", field: value, "stream": stream}, ensure_ascii=True)
        resp = client.post("/v1/responses", content=body, headers={"content-type": "application/json"})
        assert resp.status_code == 400 and resp.json()["error"]["param"].split(".")[0] == field, resp.text


def test_a_reply_cut_by_max_output_tokens_ends_with_an_incomplete_item(tmp_path):
    """As OpenAI's: in an ``incomplete`` response the message the limit cut is ``incomplete``
    too, plain and streamed (its ``output_item.done``); a whole reply's message is ``completed``."""
    from tests.unit.serving.test_reasoning_routes import ANSWER

    _, client = _client(REPLY, tmp_path)
    body = {"model": "glm", "input": ASK, "max_output_tokens": len(REPLY) - 5}
    plain = client.post("/v1/responses", json=body).json()
    assert plain["status"] == "incomplete"
    assert [(i["type"], i.get("status")) for i in plain["output"]] == [("reasoning", None), ("message", "incomplete")]
    assert plain["output"][1]["content"][0]["text"] == ANSWER[:-5].rstrip()
    events = _sse(client, "/v1/responses", body)
    assert [e["item"].get("status") for e in events if e["type"] == "response.output_item.done"] == [
        None, "incomplete"]
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["output"][1]["status"] == "incomplete"
    whole = client.post("/v1/responses", json={**body, "max_output_tokens": 200}).json()
    assert whole["status"] == "completed" and whole["output"][1]["status"] == "completed"


@pytest.mark.parametrize(("extra", "param"), [
    ({"metadata": {"k": "v" * 513}}, "metadata"), ({"metadata": {"k" * 65: "v"}}, "metadata"),
    ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
    ({"text": {"format": {"type": "json_schema", "schema": {"type": "object"}}}}, "text.format.name"),
    ({"text": {"format": {"type": "json_schema", "name": "a b", "schema": {"type": "object"}}}}, "text.format.name"),
])
def test_what_openai_refuses_is_refused(tmp_path, extra, param):
    """``metadata``: at most 16 pairs, keys of 64 characters, values of 512; a ``json_schema``
    text format needs a ``name`` of letters, digits, ``_`` and ``-``."""
    _, client = _client(REPLY, tmp_path)
    resp = client.post("/v1/responses", json={"model": "glm", "input": ASK, **extra})
    assert resp.status_code == 400 and resp.json()["error"]["param"].startswith(param), resp.text


def test_sealed_reasoning_opens_only_for_the_key_it_was_made_for(tmp_path):
    """Issue 91, 7: a token is bound to its API key (sealed inside with the key's owner
    digest): sent back by another key, it is the 400 of a token this server never made."""
    engine = FakeEngine(reply=REPLY, context_length=8000, grammar=True)
    chat = ChatService(ModelPipeline(engine, "glm", ChatTemplate(GLM47), "glm47"))
    client = TestClient(create_app(one_model(chat, seal=ReasoningSeal(tmp_path)), AppOptions(api_key=["ka", "kb"])))
    alice, bob = {"Authorization": "Bearer ka"}, {"Authorization": "Bearer kb"}
    first = client.post("/v1/responses", headers=alice, json={"model": "glm", "input": ASK, **INCLUDE}).json()
    reasoning, message = first["output"]
    history = ASK + [{"type": "reasoning", "id": reasoning["id"], "summary": [],
                      "encrypted_content": reasoning["encrypted_content"]}, message, {"role": "user", "content": "And?"}]
    assert client.post("/v1/responses", headers=alice, json={"model": "glm", "input": history}).status_code == 200
    refused = client.post("/v1/responses", headers=bob, json={"model": "glm", "input": history})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "input.1.encrypted_content"


def test_finished_background_runs_keep_a_bounded_number_of_events(monkeypatch):
    """Issue 91, 7: the events of finished runs (kept for streams that resume) are bounded in
    all, not only by runs and age: past ``MAX_EVENTS_KEPT`` the oldest finished runs go first;
    a running run's are never dropped."""
    from glmserve.protocol.responses import ResponseEvent
    from glmserve.serving.responses import background
    from glmserve.serving.responses.run_events import Run

    monkeypatch.setattr(background, "MAX_EVENTS_KEPT", 250)
    runs = background.BackgroundRuns(None)
    event = ResponseEvent(type="response.output_text.delta", sequence_number=0, delta="x")
    for i, finished in enumerate([1.0, 2.0, 3.0, None]):
        run = Run(owner="o", events=[event] * 100)
        run.finished_at = None if finished is None else time.monotonic()
        runs._runs[f"resp_{i}"] = run
    runs._forget_old_runs()
    assert list(runs._runs) == ["resp_1", "resp_2", "resp_3"]  # 200 finished events kept, and the running run's
