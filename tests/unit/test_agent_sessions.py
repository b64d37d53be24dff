"""``benchmarks/agent_sessions.py``'s parts: the recording proxy passes a stream through whole
and notes its route, TTFT and the usage a server gave; the usage of whole and streamed
Anthropic replies; the report's per-round ratios of the sessions' wall times."""

from __future__ import annotations

import argparse
import asyncio
import json

import httpx
from starlette.applications import Starlette
from starlette.responses import StreamingResponse
from starlette.routing import Route

from tests.benchmark_scripts import load

agent_sessions = load("agent_sessions")

STREAM = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in [
    {"type": "message_start", "message": {"usage": {"input_tokens": 20, "cache_read_input_tokens": 0,
                                                     "output_tokens": 1}}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}},
    {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
     "usage": {"input_tokens": 7, "cache_read_input_tokens": 13, "output_tokens": 2}},
    {"type": "message_stop"}])


def test_the_usage_of_a_stream_is_its_last_counts_and_of_a_whole_reply_its_own():
    assert agent_sessions.usage_of(STREAM.encode()) == {"input_tokens": 7, "cache_read_input_tokens": 13,
                                                        "output_tokens": 2}
    assert agent_sessions.usage_of(b'{"usage": {"input_tokens": 3}}') == {"input_tokens": 3}
    assert agent_sessions.usage_of(b"not json") == {}


def test_the_proxy_passes_a_stream_on_whole_and_notes_it():
    async def upstream(request):
        async def events():
            for block in STREAM.split("\n\n")[:-1]:
                yield (block + "\n\n").encode()
        return StreamingResponse(events(), media_type="text/event-stream")

    recorder = agent_sessions.Recorder()
    recorder._client = httpx.AsyncClient(transport=httpx.ASGITransport(
        Starlette(routes=[Route("/v1/messages", upstream, methods=["POST"])])))
    recorder.upstream, recorder.session = "http://upstream", "session 1"

    async def ask() -> str:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(recorder.app), base_url="http://proxy") as client:
            return (await client.post("/v1/messages", json={"stream": True})).text

    assert asyncio.run(ask()) == STREAM
    [noted] = recorder.requests
    assert noted["session"] == "session 1" and noted["route"] == "/v1/messages" and noted["status"] == 200
    assert (noted["input"], noted["cached"]) == (7, 13) and 0 < noted["ttft"] <= noted["wall"]


def test_the_report_gives_glmserve_over_llama_server_per_round():
    def system(walls: list[tuple[float, float]], ttft_share: float) -> list[dict]:
        return [{f"session {i}": {"wall": w, "exit": 0, "answer": "ok", "requests": [
            {"route": "/v1/models", "ttft": 0.01},  # not a model turn: the first turn is the first /v1/messages
            {"route": "/v1/messages", "input": 100, "cached": 0, "ttft": w * ttft_share}]}
            for i, w in enumerate(pair, 1)} for pair in walls]

    args = argparse.Namespace(threads=2, max_turns=3, rounds=2)
    text, stats = agent_sessions.report({"glmserve": system([(300, 60), (320, 80)], 0.1),
                                         "llama-server": system([(300, 300), (320, 320)], 0.5)}, args)
    ratio = stats["glmserve"]["session 2"]["wall_vs_llama_server"]
    assert ratio["rounds"] == [0.2, 0.25] and ratio["median"] == 0.225
    first = stats["glmserve"]["session 2"]["first_ttft_vs_llama_server"]  # 6 / 150 and 8 / 160
    assert first["rounds"] == [0.04, 0.05] and "first request's TTFT glmserve / llama-server 0.045" in text
    assert stats["glmserve"]["session 1"]["wall_vs_llama_server"]["median"] == 1.0
    assert "| glmserve | session 2 | 70.0 | [60, 80] | 2 |" in text
