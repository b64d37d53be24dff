"""``glmserve chat`` refuses a flag it does not use (a server's flag in-process, any serve flag
but --model and --api-key with --url), given on the command line; ``GLMSERVE_*`` variables
in the environment may be a server's and are left alone. ``LLM()`` refuses a keyword that is
not a model setting."""

from __future__ import annotations

import pytest

from glmserve import cli
from glmserve.flags import given_flags, parse_flags
from glmserve.llm import LLM
from glmserve.settings.serve import ChatSettings


def unused(*args: str) -> list[str]:
    args = list(args)
    return parse_flags(ChatSettings, args).unused(given_flags(ChatSettings, args))


def test_in_process_the_servers_flags_are_unused_and_the_models_are_used():
    assert unused("--store-ttl", "5s", "--port", "9", "--no-ui", "--n-ctx", "512", "--temperature", "0") == [
        "--port", "--store-ttl", "--ui"]
    assert unused("--n-ctx", "512", "--n-threads", "1", "--system", "hi") == []


def test_with_url_only_model_and_api_key_of_the_serve_flags_are_used():
    assert unused("--url", "http://127.0.0.1:9", "--model", "m", "--api-key", "k", "--max-tokens", "5") == []
    assert unused("--url", "http://127.0.0.1:9", "--n-ctx", "512", "--batch-lease", "4s") == [
        "--batch-lease", "--n-ctx"]


def test_a_servers_variables_in_the_environment_are_not_flags_given(monkeypatch):
    monkeypatch.setenv("GLMSERVE_STORE_TTL", "5s")
    monkeypatch.setenv("GLMSERVE_N_CTX", "512")
    assert unused("--n-threads", "1") == []
    assert unused("--url", "http://127.0.0.1:9") == []


def test_chat_exits_2_with_one_line_naming_the_flags(capsys):
    assert cli.chat(["--store-ttl", "5s", "--database-url", "sqlite:///x.db"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not use --database-url, --store-ttl" in err
    assert cli.chat(["--url", "http://127.0.0.1:9", "--n-ctx", "512"]) == 2
    assert "--url sends requests to a running server and does not use --n-ctx" in capsys.readouterr().err


@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"port": 9}, "does not take port: a server's settings"),
    ({"n_ctxx": 512}, "does not take n_ctxx: not a model setting"),
])
def test_llm_refuses_what_is_not_a_model_setting_before_loading(kwargs, needle):
    with pytest.raises(TypeError, match=needle):
        LLM(**kwargs)
