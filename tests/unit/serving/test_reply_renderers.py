"""One recorded reply stream (``serving/generation/reply.py``) fed to the three renderers, whole
and streamed: chat completions, Messages and Responses each write it in their wire form, the
streamed form joins to the whole one, and a call keeps its one id in every API (with the API's
prefix)."""

from __future__ import annotations

import asyncio
import json

import pytest

from glmserve.protocol.errors import server_error
from glmserve.protocol.responses import Response
from glmserve.serving.chat.render import chunks, completion
from glmserve.serving.generation.reply import CallStart, Done, Finish, Reply, TextDelta, Tokens, collect
from glmserve.serving.messages.render import MessageEvents, message
from glmserve.serving.responses.render import ResponseEvents, response

CALL = "0123456789abcdef01234567"
EVENTS = [
    TextDelta("reasoning", "Let me "), TextDelta("reasoning", "check."),
    TextDelta("content", "Checking "), TextDelta("content", "the weather."),
    CallStart(CALL, "get_weather"),
    TextDelta("arguments", '{"city": '), TextDelta("arguments", '"Oslo"}'),
    Finish("stop", None, calls=True),
    Done(Tokens(prompt=12, completion=9, cached=4)),
]
CUT = [TextDelta("content", "It is"), Finish("length"), Done(Tokens(5, 2))]
STOPPED = [TextDelta("content", "Done"), Finish("stop", "END"), Done(Tokens(5, 1))]


def _reply(events: list, fail: bool = False) -> Reply:
    async def gen():
        for event in events:
            yield event
        if fail:
            raise server_error("generation failed: boom")
    return Reply(gen(), id="chatcmpl-1", created=1700000000, model="glm", n=1, logprobs=False, prompt_tokens=12)


def _decode(ids: list[int]) -> str:
    return "".join(map(chr, ids))


def _shell() -> Response:
    return Response(id="resp_1", created_at=1, status="in_progress", model="glm", tools=[], tool_choice="auto",
                    parallel_tool_calls=True, text={"format": {"type": "text"}})


def _run(agen) -> list:
    async def read():
        return [item async for item in agen]
    return asyncio.run(read())


def _whole(events: list):
    return asyncio.run(collect(_reply(events)))


def _dump(item) -> dict:
    if isinstance(item, str):
        return json.loads(item)
    if isinstance(item, dict):  # an encoded Messages event
        return json.loads(item["data"])
    return json.loads(item.model_dump_json(exclude_none=True))


# ---- chat completions ---------------------------------------------------------------------

def test_chat_completion_whole():
    body = completion(_reply(EVENTS), _whole(EVENTS), _decode).model_dump(exclude_none=True)
    assert body["id"] == "chatcmpl-1" and body["object"] == "chat.completion" and body["model"] == "glm"
    assert body["choices"] == [{"index": 0, "finish_reason": "tool_calls", "logprobs": None, "message": {
        "role": "assistant", "content": "Checking the weather.", "reasoning_content": "Let me check.",
        "tool_calls": [{"id": f"call_{CALL}", "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]}}]
    assert body["usage"] == {"prompt_tokens": 12, "completion_tokens": 9, "total_tokens": 21,
                             "prompt_tokens_details": {"cached_tokens": 4}}


@pytest.mark.parametrize("encoded", [False, True])
def test_chat_completion_stream(encoded):
    sent = [_dump(c) for c in _run(chunks(_reply(EVENTS), True, _decode, encoded))]
    assert all(c["id"] == "chatcmpl-1" and c["object"] == "chat.completion.chunk" for c in sent)
    deltas = [(c["choices"][0]["delta"], c["choices"][0].get("finish_reason")) for c in sent if c["choices"]]
    assert deltas == [
        ({"role": "assistant", "content": ""}, None),
        ({"reasoning_content": "Let me "}, None), ({"reasoning_content": "check."}, None),
        ({"content": "Checking "}, None), ({"content": "the weather."}, None),
        ({"tool_calls": [{"index": 0, "id": f"call_{CALL}", "type": "function",
                          "function": {"name": "get_weather", "arguments": ""}}]}, None),
        ({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}, None),
        ({"tool_calls": [{"index": 0, "function": {"arguments": '"Oslo"}'}}]}, None),
        ({}, "tool_calls")]
    assert sent[-1]["choices"] == [] and sent[-1]["usage"]["total_tokens"] == 21
    assert sum(isinstance(c, str) for c in _run(chunks(_reply(EVENTS), True, _decode, encoded))) == 6 * encoded


def test_chat_completion_cut_stopped_and_failed():
    assert completion(_reply(CUT), _whole(CUT), _decode).choices[0].finish_reason == "length"
    stopped = completion(_reply(STOPPED), _whole(STOPPED), _decode).choices[0]
    assert (stopped.finish_reason, stopped.stop_reason, stopped.message.content) == ("stop", "END", "Done")
    failed = [_dump(c) for c in _run(chunks(_reply(EVENTS[:3], fail=True), True, _decode))]
    assert failed[-2]["choices"][0]["delta"] == {"content": "Checking "}
    assert (failed[-1]["error"]["type"], failed[-1]["error"]["message"]) == ("server_error", "generation failed: boom")
    with pytest.raises(Exception, match="boom"):
        asyncio.run(collect(_reply(EVENTS[:3], fail=True)))


# ---- Messages -----------------------------------------------------------------------------

def test_message_whole():
    body = message(_whole(EVENTS), "glm", show_thinking=True).model_dump()
    assert body["id"].startswith("msg_") and body["role"] == "assistant" and body["model"] == "glm"
    assert body["content"] == [{"type": "thinking", "thinking": "Let me check.", "signature": ""},
                               {"type": "text", "text": "Checking the weather."},
                               {"type": "tool_use", "id": f"toolu_{CALL}", "name": "get_weather",
                                "input": {"city": "Oslo"}}]
    assert (body["stop_reason"], body["stop_sequence"]) == ("tool_use", None)
    assert body["usage"]["input_tokens"] == 8 and body["usage"]["cache_read_input_tokens"] == 4
    assert body["usage"]["output_tokens"] == 9
    assert [b["type"] for b in message(_whole(EVENTS), "glm", show_thinking=False).content] == ["text", "tool_use"]


@pytest.mark.parametrize("encoded", [False, True])
def test_message_stream(encoded):
    sent = _run(MessageEvents(_reply(EVENTS), "glm", True, encoded).events())
    events = [_dump(e) for e in sent]
    assert [e["type"] for e in events] == [
        "message_start", "ping",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
        "message_delta", "message_stop"]
    assert events[0]["message"]["usage"]["input_tokens"] == 12
    starts = [e["content_block"] for e in events if e["type"] == "content_block_start"]
    assert starts == [{"type": "thinking", "thinking": "", "signature": ""}, {"type": "text", "text": ""},
                      {"type": "tool_use", "id": f"toolu_{CALL}", "name": "get_weather", "input": {}}]
    deltas = [(e["index"], e["delta"]) for e in events if e["type"] == "content_block_delta"]
    assert deltas == [(0, {"type": "thinking_delta", "thinking": "Let me "}),
                      (0, {"type": "thinking_delta", "thinking": "check."}),
                      (1, {"type": "text_delta", "text": "Checking "}),
                      (1, {"type": "text_delta", "text": "the weather."}),
                      (2, {"type": "input_json_delta", "partial_json": '{"city": '}),
                      (2, {"type": "input_json_delta", "partial_json": '"Oslo"}'})]
    assert events[-2]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert events[-2]["usage"]["output_tokens"] == 9
    # every delta but a text block's first came encoded
    assert sum(isinstance(e, dict) for e in sent) == (4 if encoded else 0)


def test_message_cut_stopped_and_failed():
    assert message(_whole(CUT), "glm", True).stop_reason == "max_tokens"
    stopped = message(_whole(STOPPED), "glm", True)
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", "END")
    events = [_dump(e) for e in _run(MessageEvents(_reply(EVENTS[:3], fail=True), "glm", True, False).events())]
    assert [e["type"] for e in events][-3:] == ["content_block_delta", "content_block_stop", "error"]
    assert events[-1]["error"] == {"type": "api_error", "message": "generation failed: boom"}


# ---- Responses ----------------------------------------------------------------------------

def test_response_whole():
    body = response(_shell(), _whole(EVENTS), {}, None).model_dump()
    assert body["status"] == "completed" and body["completed_at"] is not None
    reasoning, said, call = body["output"]
    assert reasoning["type"] == "reasoning" and reasoning["content"] == [{"type": "reasoning_text",
                                                                           "text": "Let me check."}]
    assert said["type"] == "message" and said["content"][0]["text"] == "Checking the weather."
    assert {k: call[k] for k in ("type", "call_id", "name", "arguments", "status")} == {
        "type": "function_call", "call_id": f"call_{CALL}", "name": "get_weather", "arguments": '{"city": "Oslo"}',
        "status": "completed"}
    assert body["usage"]["input_tokens"] == 12 and body["usage"]["input_tokens_details"]["cached_tokens"] == 4
    assert body["usage"]["output_tokens"] == 9 and body["usage"]["total_tokens"] == 21


@pytest.mark.parametrize("encoded", [False, True])
def test_response_stream(encoded):
    sent = _run(ResponseEvents(_reply(EVENTS), _shell(), {}, None, encoded).events())
    events = [json.loads(e if isinstance(e, str) else e.model_dump_json()) for e in sent]
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.reasoning_text.delta", "response.reasoning_text.delta",
        "response.reasoning_text.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta", "response.output_text.done", "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "response.completed"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    final = events[-1]["response"]
    whole = response(_shell(), _whole(EVENTS), {}, None).model_dump()
    strip = [{k: v for k, v in item.items() if k != "id"} for item in final["output"]]
    assert strip == [{k: v for k, v in item.items() if k != "id"} for item in whole["output"]]
    assert final["usage"] == whole["usage"]
    assert sum(isinstance(e, str) for e in sent) == (4 if encoded else 0)


def test_response_cut_stopped_and_failed():
    cut = response(_shell(), _whole(CUT), {}, None)
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    assert cut.output[-1]["status"] == "incomplete"
    streamed = [json.loads(e.model_dump_json()) for e in _run(ResponseEvents(_reply(CUT), _shell(), {}, None,
                                                                             False).events())]
    assert streamed[-1]["type"] == "response.incomplete"
    assert streamed[-1]["response"]["output"][-1]["status"] == "incomplete"
    assert response(_shell(), _whole(STOPPED), {}, None).status == "completed"
    failed = [json.loads(e.model_dump_json())
              for e in _run(ResponseEvents(_reply(EVENTS[:3], fail=True), _shell(), {}, None, False).events())]
    assert [e["type"] for e in failed][-3:] == ["response.content_part.done", "response.output_item.done", "error"]
    assert failed[-1]["message"] == "generation failed: boom"
