"""Serving + HTTP layers over a fake engine: request mapping, context checks, and a failing
request that ends with an error while the server keeps serving others."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from glmserve.chat import CHATML_TEMPLATE, ChatTemplate
from glmserve.protocol.chat import ChatCompletionRequest
from glmserve.protocol.errors import APIError
from glmserve.server import AppOptions, create_app
from glmserve.serving.chat.service import ChatService
from glmserve.serving.generation.pipeline import ModelPipeline
from glmserve.serving.generation.sampling import check_supported, to_sampling_params
from tests.unit.fakes import FakeEngine, one_model


@pytest.fixture()
def engine():
    return FakeEngine()


@pytest.fixture()
def http(engine):
    service = ChatService(ModelPipeline(engine, "fake", ChatTemplate(CHATML_TEMPLATE)))
    with TestClient(create_app(one_model(service))) as client:
        yield client


def _body(content="Hi", **kw):
    return {"model": "fake", "messages": [{"role": "user", "content": content}], **kw}


def _req(**kw) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(_body(**kw))


def test_end_of_turn_token_from_template(engine):
    service = ChatService(ModelPipeline(engine, "fake", ChatTemplate(CHATML_TEMPLATE)))
    assert service.pipeline.stop_token_ids == (1001,)


def test_sampling_defaults_and_mapping():
    sp = to_sampling_params(_req(), 10, (7,))
    assert (sp.temperature, sp.top_p, sp.top_k, sp.min_p, sp.repetition_penalty) == (1.0, 1.0, 0, 0.0, 1.0)
    assert sp.stop_token_ids == (7,) and sp.max_tokens == 10 and sp.seed is None
    sp = to_sampling_params(_req(temperature=0.5, top_p=0.9, top_k=40, min_p=0.1, repetition_penalty=1.2,
                                 presence_penalty=0.3, frequency_penalty=-0.3, seed=9, ignore_eos=True), 5, ())
    assert (sp.temperature, sp.top_p, sp.top_k, sp.min_p, sp.repetition_penalty) == (0.5, 0.9, 40, 0.1, 1.2)
    assert (sp.presence_penalty, sp.frequency_penalty, sp.seed, sp.ignore_eos) == (0.3, -0.3, 9, True)
    assert to_sampling_params(_req(top_p=0), 5, ()).greedy
    assert to_sampling_params(_req(top_k=-1), 5, ()).top_k == 0


@pytest.mark.parametrize("kw, param", [
    ({"top_logprobs": 2}, "top_logprobs"),  # without logprobs: true
])
def test_unsupported_options_are_refused(kw, param):
    with pytest.raises(APIError) as info:
        check_supported(_req(**kw))
    assert info.value.status_code == 400 and info.value.param == param


@pytest.mark.parametrize("bias, fragment", [
    ({"1100": 5}, "'1100'"),          # FakeTokenizer.n_vocab is 1100
    ({"-1": 5, "abc": 1}, "'-1', 'abc'"),
    ({"5": 101}, "between -100 and 100"),
    ({str(i): 1 for i in range(1025)}, "at most 1024"),
])
def test_logit_bias_is_checked(http, bias, fragment):
    resp = http.post("/v1/chat/completions", json=_body(logit_bias=bias))
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "logit_bias"
    assert fragment in resp.json()["error"]["message"]


def test_logit_bias_reaches_the_engine(http, engine):
    assert http.post("/v1/chat/completions", json=_body(logit_bias={"72": -100, " 7": 2.5})).status_code == 200
    assert engine.requests[-1].sampling.logit_bias == {72: -100.0, 7: 2.5}


def test_unknown_route_is_a_404_naming_it(http):
    resp = http.post("/v1/nope", json={})
    assert resp.status_code == 404 and resp.json()["error"]["message"] == "Invalid URL (POST /v1/nope)"


def test_tools_need_a_tool_call_format(http):
    resp = http.post("/v1/chat/completions", json=_body(tools=[{"type": "function", "function": {"name": "f"}}]))
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "tools"
    ok = http.post("/v1/chat/completions", json=_body(tools=[{"type": "function", "function": {"name": "f"}}],
                                                      tool_choice="none"))
    assert ok.status_code == 200


def test_json_mode_needs_constrained_decoding(http):
    resp = http.post("/v1/chat/completions", json=_body(response_format={"type": "json_object"}))
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "response_format"


def test_plain_and_usage(http, engine):
    body = http.post("/v1/chat/completions", json=_body()).json()
    assert body["choices"][0]["message"]["content"] == "Hello there"
    prompt = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert body["usage"]["prompt_tokens"] == len(engine.tokenizer.encode(prompt))
    assert body["usage"]["completion_tokens"] == len("Hello there")
    assert engine.requests[0].sampling.max_tokens == 256 - body["usage"]["prompt_tokens"]


def test_max_completion_tokens_wins_over_max_tokens(http, engine):
    body = http.post("/v1/chat/completions", json=_body(max_tokens=9, max_completion_tokens=4)).json()
    assert body["choices"][0]["message"]["content"] == "Hell"
    assert body["choices"][0]["finish_reason"] == "length"


def test_context_checks(http):
    resp = http.post("/v1/chat/completions", json=_body("x" * 300))
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "context_length_exceeded"
    resp = http.post("/v1/chat/completions", json=_body(max_tokens=250))
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "max_tokens"


def test_stop_string_aborts_engine(http, engine):
    body = http.post("/v1/chat/completions", json=_body(stop="lo t")).json()
    assert body["choices"][0]["message"]["content"] == "Hel"
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["completion_tokens"] == len("Hello t")
    assert engine.aborted == [engine.requests[0].request_id]


@pytest.mark.parametrize("cue", ["FAIL", "CRASH"])
def test_engine_failure_ends_only_that_request(http, cue):
    resp = http.post("/v1/chat/completions", json=_body(cue))
    assert resp.status_code == 500
    error = resp.json()["error"]
    assert error["type"] == "server_error" and "generation failed" in error["message"]
    # streamed: an error event, no [DONE]
    with http.stream("POST", "/v1/chat/completions", json=_body(cue, stream=True)) as stream:
        events = [line[len("data: "):] for line in stream.iter_lines() if line.startswith("data: ")]
    assert json.loads(events[0])["choices"][0]["delta"]["role"] == "assistant"
    assert "error" in json.loads(events[-1]) and "[DONE]" not in events
    assert "".join(json.loads(e)["choices"][0]["delta"].get("content", "") for e in events[:-1]) == "Hel"
    # and the next request is served normally
    ok = http.post("/v1/chat/completions", json=_body("fine"))
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] == "Hello there"


def test_template_rejection_is_400(engine):
    strict = ChatTemplate("{{ raise_exception('roles must alternate') }}")
    with TestClient(create_app(one_model(ModelPipeline(engine, "fake", strict)))) as client:
        resp = client.post("/v1/chat/completions", json=_body())
    assert resp.status_code == 400
    assert "roles must alternate" in resp.json()["error"]["message"]


def test_health_reports_a_broken_engine(engine, http):
    assert http.get("/health").json() == {"status": "ok"}
    engine.broken = True
    response = http.get("/health")
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "engine_unhealthy"
    assert "worker thread" in response.json()["error"]["message"]


def test_replica_header_and_deployment_health(engine):
    async def deployment() -> dict:
        return {"replicas": {"RUNNING": 2}}

    service = ChatService(ModelPipeline(engine, "fake", ChatTemplate(CHATML_TEMPLATE)))
    with TestClient(create_app(one_model(service), AppOptions(replica_id="r1", deployment_health=deployment))) as client:
        health = client.get("/health")
        assert health.json() == {"status": "ok", "replica": "r1", "deployment": {"replicas": {"RUNNING": 2}}}
        models = client.get("/v1/models")
        assert models.headers["x-glmserve-replica"] == "r1" and models.headers["x-request-id"]
    with TestClient(create_app(one_model(service))) as client:
        assert "x-glmserve-replica" not in client.get("/v1/models").headers


def test_max_new_tokens_is_the_default_max_tokens(engine):
    """``--override-generation-config '{"max_new_tokens": N}'`` (vLLM's key): a request without
    ``max_tokens`` gets N, lowered to what the prompt leaves of the context rather than refused;
    a request's own ``max_tokens`` wins."""
    service = ChatService(ModelPipeline(engine, "fake", ChatTemplate(CHATML_TEMPLATE), generation_defaults={"max_new_tokens": 7}))
    with TestClient(create_app(one_model(service))) as client:
        assert client.post("/v1/chat/completions", json=_body()).status_code == 200
        assert client.post("/v1/chat/completions", json=_body(max_tokens=3)).status_code == 200
        assert client.post("/v1/completions", json={"model": "fake", "prompt": "Hi"}).status_code == 200
    assert [r.sampling.max_tokens for r in engine.requests] == [7, 3, 7]
    service = ChatService(ModelPipeline(engine, "fake", ChatTemplate(CHATML_TEMPLATE), generation_defaults={"max_new_tokens": 10**6}))
    with TestClient(create_app(one_model(service))) as client:
        assert client.post("/v1/chat/completions", json=_body()).status_code == 200  # a ceiling: never a 400
    assert engine.requests[-1].sampling.max_tokens == 256 - len(engine.requests[-1].prompt_token_ids)


def test_streams_escape_the_line_breaks_that_json_leaves_raw():
    """U+0085, U+2028 and U+2029 in generated text reach a line reader that splits at them
    (httpx's iter_lines: str.splitlines) as JSON escapes, in both SSE dialects; the text is
    unchanged."""
    reply = "a\u2028b\x85c\u2029d"
    service = ChatService(ModelPipeline(FakeEngine(reply), "fake", ChatTemplate(CHATML_TEMPLATE)))
    with TestClient(create_app(one_model(service))) as client:
        with client.stream("POST", "/v1/chat/completions", json=_body(stream=True)) as stream:
            raw = stream.read()
            events = [line[len("data: "):] for line in raw.decode().splitlines() if line.startswith("data: ")]
        with client.stream("POST", "/v1/messages", json={**_body(stream=True), "max_tokens": 16}) as stream:
            lines = [line for line in stream.iter_lines() if line.startswith("data: ")]
    assert b"\\u2028" in raw and b"\\u0085" in raw and b"\\u2029" in raw
    chunks = [json.loads(e) for e in events if e != "[DONE]"]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == reply
    deltas = [json.loads(line[len("data: "):]) for line in lines]
    assert "".join(d["delta"].get("text", "") for d in deltas if d["type"] == "content_block_delta") == reply


def test_a_log_line_written_for_a_request_names_its_id():
    """``server/logs.py``: what is logged while a request is handled (here the engine's
    failure, whole and in a stream) carries the ``x-request-id`` its response carries."""
    import logging

    from glmserve.server.logs import RequestIdFilter

    lines: list[str] = []
    handler = logging.Handler()
    handler.addFilter(RequestIdFilter())
    handler.emit = lambda record: lines.append(f"{record.getMessage()}|{record.request_tag}")
    logging.getLogger().addHandler(handler)
    try:
        with TestClient(create_app(one_model(ModelPipeline(FakeEngine(embedding_size=4), "fake", ChatTemplate(CHATML_TEMPLATE)))),
                        raise_server_exceptions=False) as client:
            resp = client.post("/v1/embeddings", json={"model": "fake", "input": "boom!"},
                               headers={"X-Request-Id": "trace-9"})
            streamed = client.post("/v1/chat/completions", headers={"X-Request-Id": "trace-10"}, json={
                "model": "fake", "stream": True, "messages": [{"role": "user", "content": "FAIL"}]})
    finally:
        logging.getLogger().removeHandler(handler)
    assert resp.status_code == 500 and resp.headers["x-request-id"] == "trace-9"
    assert '"error"' in streamed.text
    assert any(line.endswith("| trace-9") for line in lines), lines
    assert any("a stream ended with an error" in line and line.endswith("| trace-10") for line in lines), lines
    assert all(line.endswith(("| trace-9", "| trace-10", "|")) for line in lines), lines


def test_requests_holding_images_before_admission_are_bounded():
    """Issue 91, 4: a request with images holds them from before they are fetched until its
    runs are admitted; at most ``max_num_seqs + max_queue`` such requests at once (1 + 1
    here), the next is a 429 before anything of it is fetched, and the places come back."""
    import asyncio
    import dataclasses

    from glmserve.multimodal import MediaPolicy
    from tests.image_site import REQUESTS, image_site

    engine = FakeEngine(reply="Hi")
    engine.model_info = dataclasses.replace(engine.model_info, vision=True, max_num_seqs=1, max_queue=1)
    pipeline = ModelPipeline(engine, "fake", ChatTemplate(CHATML_TEMPLATE),
                             media_policy=MediaPolicy(allowed_domains=frozenset({"127.0.0.1"}), timeout_s=30))
    service = ChatService(pipeline)

    def ask(url: str) -> ChatCompletionRequest:
        return _req(messages=[{"role": "user", "content": [{"type": "text", "text": "What is it?"},
                                                           {"type": "image_url", "image_url": {"url": url}}]}])

    async def scenario(site: str):
        slow = [asyncio.create_task(service.create(ask(f"{site}/slow"))) for _ in range(2)]
        for _ in range(3000):  # the two hold their places while their images are fetched (3 s)
            if "images" in pipeline._gates and pipeline._gates["images"].in_flight == 2:
                break
            await asyncio.sleep(0.001)
        else:
            pytest.fail("no place was taken for the requests with images")
        fetched = len(REQUESTS)
        with pytest.raises(APIError) as refused:
            await service.create(ask(f"{site}/ok.png"))
        assert "/ok.png" not in REQUESTS[fetched:]  # refused before its image was fetched
        await asyncio.gather(*slow, return_exceptions=True)  # they end (the fake has no image processor)
        return refused.value, pipeline._gates["images"].in_flight

    with image_site() as site:
        refused, left = asyncio.run(scenario(site))
    assert (refused.status_code, refused.headers.get("Retry-After"), left) == (429, "1", 0)
