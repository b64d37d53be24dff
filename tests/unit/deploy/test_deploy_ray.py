"""Ray Serve deployment: the flags (``DeploySettings``), the deployment options they become,
the settings each replica rebuilds, the ``serve run`` builder's refusals, and the proxy
middleware that gives OpenAI errors for what Ray Serve's proxy answers itself."""

from __future__ import annotations

import asyncio
import json

import pytest
from pydantic import ValidationError

from glmserve.settings.serve import DeploySettings, ServeSettings

pytest.importorskip("ray.serve")
from glmserve.deploy.proxy import OpenAIErrors  # noqa: E402
from glmserve.deploy.ray import build, deployment_options, replica_settings  # noqa: E402


def _settings(*args: str) -> DeploySettings:
    from pydantic_settings import CliApp

    return CliApp.run(DeploySettings, cli_args=list(args))


def test_single_server_unless_replicas_asked_for():
    assert not _settings().on_ray
    assert _settings("--replicas", "2").on_ray
    assert _settings("--ray-address", "auto").on_ray
    assert _settings("--min-replicas", "1", "--max-replicas", "3").on_ray


@pytest.mark.parametrize("args, message", [
    (("--replica-cpus", "2"), "needs Ray Serve replicas"),
    (("--replica-gpus", "1"), "needs Ray Serve replicas"),
    (("--min-replicas", "1"), "go together"),
    (("--replicas", "2", "--min-replicas", "1", "--max-replicas", "2"), "not both"),
    (("--min-replicas", "3", "--max-replicas", "2"), "larger than"),
    (("--replicas", "0"), "greater than or equal to 1"),
    (("--replicas", "2", "--fd", "3"), "Ray Serve's proxy listens"),
])
def test_bad_ray_flags(args, message):
    with pytest.raises(ValidationError, match=message):
        _settings(*args)


def test_fixed_replicas_options():
    options = deployment_options(_settings("--replicas", "3", "--replica-cpus", "2", "--max-num-seqs", "4",
                                           "--max-queue", "10", "--shutdown-timeout", "7"))
    assert options["num_replicas"] == 3 and "autoscaling_config" not in options
    assert options["ray_actor_options"] == {"num_cpus": 2.0, "num_gpus": 0.0}
    # each replica runs --max-num-seqs; the router queue holds --max-queue plus a burst
    assert options["max_ongoing_requests"] == 4
    assert options["max_queued_requests"] == 10 + 4 * 3
    assert options["backpressure_config"] == {"status_code": 429, "retry_after_s": 1}
    assert options["graceful_shutdown_timeout_s"] == 7


def test_autoscaling_options():
    options = deployment_options(_settings("--min-replicas", "1", "--max-replicas", "4", "--max-num-seqs", "8"))
    assert options["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 8}
    assert "num_replicas" not in options
    assert options["max_queued_requests"] == 64 + 8 * 4


@pytest.mark.parametrize("engine", ["llama_cpp", "vllm"])
def test_unset_max_num_seqs_is_the_engines_default_and_the_queue_scales(engine):
    if engine == "vllm":
        pytest.importorskip("vllm")
        from vllm.engine.arg_utils import EngineArgs
        from vllm.usage.usage_lib import UsageContext

        seqs = EngineArgs.get_batch_defaults(world_size=1)[1][UsageContext.OPENAI_API_SERVER]
    else:
        seqs = 8
    options = deployment_options(_settings("--replicas", "2", "--engine", engine))
    assert options["max_ongoing_requests"] == seqs
    assert options["max_queued_requests"] == 8 * seqs + seqs * 2


def test_vllm_over_ray_reserves_a_gpu_per_worker():
    options = deployment_options(_settings("--replicas", "2", "--engine", "vllm", "--tensor-parallel-size", "2",
                                           "--pipeline-parallel-size", "2", "--distributed-executor-backend",
                                           "ray"))
    assert options["placement_group_bundles"] == [{"CPU": 1.0}] + [{"GPU": 1.0}] * 4
    assert options["placement_group_strategy"] == "PACK"
    assert options["ray_actor_options"] == {"num_cpus": 1.0}
    with pytest.raises(ValueError, match="one GPU"):
        deployment_options(_settings("--replicas", "1", "--engine", "vllm", "--distributed-executor-backend",
                                     "ray", "--replica-gpus", "1"))


def test_replica_settings_keep_only_what_was_given(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"")
    settings = _settings("--replicas", "2", "--replica-cpus", "3", "--model", str(model), "--max-num-seqs", "2",
                         "--lora", f"a={tmp_path}")
    given = replica_settings(settings)
    assert given == {"model": str(model.resolve()), "max_num_seqs": 2, "lora": [f"a={tmp_path.resolve()}"],
                     "n_threads": 3}  # threads follow the replica's CPUs
    rebuilt = ServeSettings(**given)
    assert rebuilt.model_fields_set == set(given)
    # vllm reads no --n-threads: none is passed, so the replica's engine check stays quiet
    assert "n_threads" not in replica_settings(_settings("--replicas", "1", "--engine", "vllm"))


@pytest.mark.parametrize("args", [{"port": 9000}, {"host": "0.0.0.0"}, {"ray_address": "auto"}])
def test_builder_refuses_serve_options(args):
    with pytest.raises(ValueError, match="Ray Serve's own options"):
        build(args)


def test_builder_validates_args():
    with pytest.raises(ValidationError):
        build({"replicas": 0})
    with pytest.raises(ValidationError):
        build({"max_num_seqs": "many"})


def _run_proxy(app) -> list[dict]:
    """The ASGI messages ``OpenAIErrors(app)`` sends for one HTTP request."""
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": []}
    asyncio.run(OpenAIErrors(app)(scope, receive, send))
    return sent


def test_proxy_rewrites_its_own_errors_as_openai_errors():
    async def backpressure(scope, receive, send):
        await send({"type": "http.response.start", "status": 429,
                    "headers": [(b"content-type", b"text/plain"), (b"retry-after", b"1")]})
        await send({"type": "http.response.body", "body": b"Request dropped due to backpressure."})

    start, body = _run_proxy(backpressure)
    assert start["status"] == 429 and (b"retry-after", b"1") in start["headers"]
    assert (b"content-type", b"application/json") in start["headers"]
    assert json.loads(body["body"])["error"]["message"] == "Request dropped due to backpressure."


def test_proxy_gives_502_when_the_replica_never_answered():
    async def dead(scope, receive, send):
        return None

    start, body = _run_proxy(dead)
    assert start["status"] == 502
    assert json.loads(body["body"])["error"]["code"] == "replica_failed"


def test_proxy_ends_a_cut_stream_with_an_error_event():
    async def cut(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream; charset=utf-8"), (b"x-glmserve-replica", b"r1"),
            (b"x-request-id", b"a"), (b"X-Request-ID", b"a")]})
        await send({"type": "http.response.body", "body": b"data: {}\n\n", "more_body": True})

    start, first, last = _run_proxy(cut)
    assert [k for k, _ in start["headers"] if k.lower() == b"x-request-id"] == [b"x-request-id"]
    assert first["body"] == b"data: {}\n\n"
    assert last["body"].startswith(b"data: ") and not last.get("more_body", False)
    assert json.loads(last["body"][6:])["error"]["code"] == "replica_failed"


def test_proxy_passes_a_whole_replica_answer_through():
    async def ok(scope, receive, send):
        await send({"type": "http.response.start", "status": 404, "headers": [
            (b"content-type", b"application/json"), (b"x-glmserve-replica", b"r1")]})
        await send({"type": "http.response.body", "body": b'{"error": {"message": "no"}}'})

    start, body = _run_proxy(ok)
    assert start["status"] == 404 and body["body"] == b'{"error": {"message": "no"}}'


def test_a_session_is_named_by_header_then_prompt_cache_key_then_user_id():
    from glmserve.deploy.affinity import session_name

    body = json.dumps({"prompt_cache_key": "k", "metadata": {"user_id": "u"}}).encode()
    assert session_name(b"h", body) == "h"
    assert session_name(None, body) == "k"
    assert session_name(None, json.dumps({"metadata": {"user_id": "u"}}).encode()) == "u"
    for other in (b"{not json", b"[1]", b'{"prompt_cache_key": 5, "metadata": "x"}', b""):
        assert session_name(None, other) is None


def _through_affinity(chunks: list[bytes], headers: list | None = None) -> tuple[list, bytes]:
    """(headers the proxy app saw, body it read) for a POST sent in ``chunks``."""
    from glmserve.deploy.affinity import SessionAffinity

    seen = {}

    async def app(scope, receive, send):
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        seen.update(headers=scope["headers"], body=body)

    messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]

    async def receive():
        return messages.pop(0)

    scope = {"type": "http", "method": "POST", "headers": headers or []}
    asyncio.run(SessionAffinity(app)(scope, receive, None))
    return seen["headers"], seen["body"]


def test_the_proxy_sets_the_session_id_and_passes_the_body_on(monkeypatch):
    import glmserve.deploy.affinity as affinity

    body = json.dumps({"model": "m", "prompt_cache_key": "codex-1", "input": "x" * 1000}).encode()
    headers, seen = _through_affinity([body[:100], body[100:]])
    assert (b"x-session-id", b"codex-1") in headers and seen == body
    headers, _ = _through_affinity([body], [(b"x-session-id", b"mine")])  # the client's own id stays
    assert headers == [(b"x-session-id", b"mine")]
    monkeypatch.setattr(affinity, "MAX_SCANNED_BODY", 500)  # too big to scan: passed on whole, unread
    headers, seen = _through_affinity([body[:600], body[600:]])
    assert headers == [] and seen == body


def test_the_proxy_reads_no_body_without_one_of_the_deployments_keys(monkeypatch):
    """Where the deployment has keys (issue 91, 6), a request without one is passed on before
    any of its body is read (the replica refuses it on its headers); one with a key (bearer or
    x-api-key) gets its session; a body that stops arriving is passed on unscanned, whole."""
    import glmserve.deploy.affinity as affinity

    monkeypatch.setenv(affinity.PROXY_KEYS_ENV, affinity.key_digests(["k1", "admin"]))
    body = json.dumps({"model": "m", "prompt_cache_key": "codex-1"}).encode()
    order: list[str] = []

    async def app(scope, receive, send):
        order.append("app")
        seen = b""
        while True:
            message = await receive()
            seen += message.get("body", b"")
            if not message.get("more_body"):
                return scope["headers"], seen

    def run(headers, chunks, delay_s=0.0):
        async def scenario():
            messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
                        for i, c in enumerate(chunks)]

            async def receive():
                order.append("receive")
                if len(messages) < len(chunks):
                    await asyncio.sleep(delay_s)
                return messages.pop(0)

            result = {}

            async def inner(scope, receive, send):
                result["out"] = await app(scope, receive, send)

            await affinity.SessionAffinity(inner)({"type": "http", "method": "POST", "headers": headers}, receive, None)
            return result["out"]
        order.clear()
        return asyncio.run(scenario())

    headers, seen = run([(b"authorization", b"Bearer wrong")], [body])
    assert order[0] == "app" and seen == body and all(k != b"x-session-id" for k, _ in headers)
    for given in ([(b"authorization", b"Bearer k1")], [(b"x-api-key", b"admin")]):
        headers, seen = run(given, [body])
        assert order[0] == "receive" and (b"x-session-id", b"codex-1") in headers and seen == body
    monkeypatch.setattr(affinity, "BODY_TIMEOUT_S", 0.05)
    headers, seen = run([(b"x-api-key", b"k1")], [body[:10], body[10:]], delay_s=0.5)  # the rest comes late
    assert seen == body and all(k != b"x-session-id" for k, _ in headers)
