"""schemathesis against the served OpenAPI document: requests generated from the spec (valid
and invalid ones) never get a 5xx, and every status, content type and JSON body the server
answers is the one the spec declares. The number of examples is bounded, and the server runs
with a small ``--n-ctx`` (and ``--max-embedding-tokens``) and 16 tokens as the reply's length
where a request gives none (``--override-generation-config``: generated chat and Responses
bodies mostly leave ``max_tokens`` out, and replies ran to the context's end, 29 and 14 s of the
suite) so that a generated request never generates or embeds for long."""

from __future__ import annotations

import json

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance

from tests.conftest import DEFAULT_MODEL, RemoteServer

MAX_EXAMPLES = 40


@pytest.fixture(scope="module")
def fuzzed_server():
    server = RemoteServer("--n-ctx", "256", "--max-num-seqs", "2", "--max-embedding-tokens", "1024",
                          "--override-generation-config", json.dumps({"max_new_tokens": 16}))
    yield server
    server.stop()


# every operation of the spec; test_every_operation_is_fuzzed keeps the list complete
STORED = ["GET /v1/responses/{response_id}", "DELETE /v1/responses/{response_id}",
          "GET /v1/responses/{response_id}/input_items", "POST /v1/responses/{response_id}/cancel",
          "POST /v1/conversations", "GET /v1/conversations/{conversation_id}",
          "POST /v1/conversations/{conversation_id}", "DELETE /v1/conversations/{conversation_id}",
          "POST /v1/conversations/{conversation_id}/items", "GET /v1/conversations/{conversation_id}/items",
          "GET /v1/conversations/{conversation_id}/items/{item_id}",
          "DELETE /v1/conversations/{conversation_id}/items/{item_id}",
          "POST /v1/files", "GET /v1/files", "GET /v1/files/{file_id}", "DELETE /v1/files/{file_id}",
          "GET /v1/files/{file_id}/content", "POST /v1/batches", "GET /v1/batches", "GET /v1/batches/{batch_id}",
          "POST /v1/batches/{batch_id}/cancel", "DELETE /v1/batches/{batch_id}", "POST /v1/messages/batches", "GET /v1/messages/batches",
          "GET /v1/messages/batches/{batch_id}", "DELETE /v1/messages/batches/{batch_id}",
          "POST /v1/messages/batches/{batch_id}/cancel", "GET /v1/messages/batches/{batch_id}/results"]
OPERATIONS = ["GET /health", "GET /v1/models", "GET /v1/models/{model_id}", "POST /v1/chat/completions",
              "POST /tokenize", "POST /detokenize", "GET /metrics", "POST /v1/completions",
              "POST /v1/responses", "POST /v1/messages", "POST /v1/messages/count_tokens",
              "POST /v1/embeddings", *STORED]


@pytest.fixture(scope="module")
def api_schema(fuzzed_server):
    return schemathesis.openapi.from_url(f"{fuzzed_server.url}/openapi.json")


def test_every_operation_is_fuzzed(api_schema):
    assert sorted(result.ok().label for result in api_schema.get_all_operations()) == sorted(OPERATIONS)


# invalid requests can be made only where a request has inputs
WITH_INPUTS = ["POST /v1/chat/completions", "POST /tokenize", "POST /detokenize", "POST /v1/completions",
               "POST /v1/responses", "POST /v1/messages", "POST /v1/messages/count_tokens", "POST /v1/embeddings",
               "GET /v1/responses/{response_id}", "GET /v1/responses/{response_id}/input_items",
               "POST /v1/conversations", "POST /v1/conversations/{conversation_id}",
               "POST /v1/conversations/{conversation_id}/items", "GET /v1/conversations/{conversation_id}/items",
               "POST /v1/files", "GET /v1/files", "POST /v1/batches", "GET /v1/batches", "POST /v1/messages/batches",
               "GET /v1/messages/batches"]


@pytest.mark.parametrize(("label", "mode"), [(op, GenerationMode.POSITIVE) for op in OPERATIONS]
                         + [(op, GenerationMode.NEGATIVE) for op in WITH_INPUTS], ids=str)
def test_api_conforms_to_its_spec(api_schema, fuzzed_server, label, mode):
    method, path = label.split(" ")
    operation = api_schema[path][method]

    # positive_data_acceptance is left out: the spec admits values the server rightly refuses
    # with a 4xx (a model id it does not serve, n > 1, a prompt over --n-ctx).
    strategy = operation.as_strategy(generation_mode=mode)
    if mode is GenerationMode.POSITIVE and method == "POST":
        strategy = strategy.map(_served_model)  # else nearly every valid body is a 404 for its model

    @given(case=strategy)
    @settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
              database=None)
    def check(case):
        case.call_and_validate(excluded_checks=[positive_data_acceptance], timeout=120)

    check()
    assert fuzzed_server.proc.poll() is None


def _served_model(case):
    if isinstance(case.body, dict):
        case.body["model"] = DEFAULT_MODEL
    return case


def test_server_healthy_after_fuzzing(fuzzed_server):
    assert httpx.get(f"{fuzzed_server.url}/health", timeout=10).status_code == 200
    reply = fuzzed_server.client().chat.completions.create(
        model=DEFAULT_MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    assert reply.usage.completion_tokens >= 1
