"""``glmserve launch`` (``launch.py``): how each agent is pointed at the server, the words
before and after ``--``, and the one-line error for an agent not installed. End to end with the
real agents: ``tests/e2e/test_launch.py``."""

from __future__ import annotations

import json
import tomllib

import pytest

from glmserve import cli
from glmserve.launch import LaunchError, agent_setup, launch, server_key, split_args
from glmserve.settings.server import ListenSettings


def test_the_words_before_and_after_the_double_dash():
    assert split_args(["--model", "o/m", "--", "-p", "hi"]) == (None, ["--model", "o/m"], ["-p", "hi"])
    assert split_args(["--url", "http://h:1/", "--", "exec", "--", "x"]) == ("http://h:1", [], ["exec", "--", "x"])
    assert split_args([]) == (None, [], [])
    with pytest.raises(LaunchError, match="--url needs a URL"):
        split_args(["--url"])


def test_each_agent_is_pointed_at_the_server_and_told_its_context(tmp_path):
    env, lead = agent_setup("claude", "http://h:1", "o/m", "k", tmp_path, 65536, environ={})
    assert lead == ["--settings", str(tmp_path / "claude-settings.json")]
    settings = json.loads((tmp_path / "claude-settings.json").read_text())["env"]
    assert env["ANTHROPIC_BASE_URL"] == settings["ANTHROPIC_BASE_URL"] == "http://h:1"
    assert env["ANTHROPIC_API_KEY"] == settings["ANTHROPIC_API_KEY"] == "k"
    assert env["ANTHROPIC_AUTH_TOKEN"] is None and settings["ANTHROPIC_AUTH_TOKEN"] == ""  # removed; blanked
    assert env["CLAUDE_CODE_USE_BEDROCK"] is None and settings["CLAUDE_CODE_USE_VERTEX"] == ""
    roles = ("ANTHROPIC_MODEL", "ANTHROPIC_DEFAULT_HAIKU_MODEL", "CLAUDE_CODE_SUBAGENT_MODEL")
    assert {env[k] for k in roles} == {settings[k] for k in roles} == {"o/m"}
    assert env["CLAUDE_CODE_ATTRIBUTION_HEADER"] == "0" and env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert (env["CLAUDE_CODE_AUTO_COMPACT_WINDOW"], env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"]) == ("65536", "16384")
    env, lead = agent_setup("codex", "http://h:1", "o/m", "k", tmp_path, 65536)
    assert env == {"GLMSERVE_API_KEY": "k"} and lead[::2] == ["-c"] * (len(lead) // 2)
    config = tomllib.loads("\n".join(lead[1::2]))  # each -c KEY=VALUE is a TOML line
    assert config["model"] == "o/m" and config["model_provider"] == "glmserve"
    assert (config["model_context_window"], config["model_auto_compact_token_limit"]) == (65536, 58982)
    assert config["model_providers"]["glmserve"] == {"name": "glmserve", "base_url": "http://h:1/v1",
                                                    "wire_api": "responses", "env_key": "GLMSERVE_API_KEY"}
    env, lead = agent_setup("opencode", "http://h:1", "o/m", "k", tmp_path, 202752)
    config = json.loads(env["OPENCODE_CONFIG_CONTENT"])
    assert lead == [] and env["GLMSERVE_API_KEY"] == "k"
    assert config["model"] == config["small_model"] == "glmserve/o/m" and config["enabled_providers"] == ["glmserve"]
    assert config["provider"]["glmserve"]["options"] == {"baseURL": "http://h:1/v1", "apiKey": "{env:GLMSERVE_API_KEY}"}
    assert config["provider"]["glmserve"]["models"]["o/m"]["limit"] == {"context": 202752, "output": 32768}


@pytest.mark.parametrize(("serve", "environ", "key", "keys"), [
    (["--api-key", "a,b"], {}, "a", ["a", "b"]), (["--api-key=a", "--n-ctx", "5", "--api-key", "b"], {}, "a", ["a", "b"]),
    (["--api-key", '["x", "y"]'], {"GLMSERVE_API_KEY": "e"}, "x", ["x", "y"]),
    ([], {"GLMSERVE_API_KEY": "e,f"}, "e", None),
])
def test_the_agents_key_is_the_first_the_server_takes_and_no_key_is_on_its_command_line(monkeypatch, serve, environ,
                                                                                          key, keys):
    monkeypatch.delenv("GLMSERVE_API_KEY", raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    first, env, flags = server_key(serve)
    assert first == key and flags == [w for w in ["--n-ctx", "5"] if w in serve]
    # the server reads its keys from GLMSERVE_API_KEY as it read them from --api-key
    assert (ListenSettings(api_key=env["GLMSERVE_API_KEY"]).api_key if env else None) == keys


def test_without_a_key_each_launch_makes_its_own(monkeypatch):
    monkeypatch.delenv("GLMSERVE_API_KEY", raising=False)
    (first, env, _), (second, _, _) = server_key([]), server_key(["--n-ctx", "1"])
    assert env == {"GLMSERVE_API_KEY": first} and first != second and len(first) >= 32


def test_claude_code_limits_set_in_the_users_environment_are_kept(tmp_path):
    env, _ = agent_setup("claude", "http://h:1", "o/m", "k", tmp_path, 65536,
                         environ={"CLAUDE_CODE_MAX_OUTPUT_TOKENS": "48", "ANTHROPIC_MODEL": "theirs"})
    settings = json.loads((tmp_path / "claude-settings.json").read_text())["env"]
    assert env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == settings["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "48"
    assert env["ANTHROPIC_MODEL"] == settings["ANTHROPIC_MODEL"] == "o/m"  # what routes to the server is the launch's
    assert settings["CLAUDE_CODE_AUTO_COMPACT_WINDOW"] == "65536"


def test_a_launched_server_s_address_is_the_launch_s():
    for flag in ("--port", "--host", "--fd"):
        with pytest.raises(LaunchError, match=f"{flag}.* cannot apply"):
            split_args(["--n-ctx", "5", flag, "1"])


def test_with_url_only_a_key_may_be_given(monkeypatch, tmp_path):
    (tmp_path / "claude").write_text("#!/bin/sh\n")
    (tmp_path / "claude").chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(LaunchError, match=r"^with --url the server runs already: serve flags \(but --api-key\)"):
        launch(["claude", "--url", "http://h:1", "--api-key", "k", "--n-ctx", "5"])


def test_an_agent_not_installed_is_named_with_its_npm_package(monkeypatch, capsys):
    monkeypatch.setenv("PATH", "")
    with pytest.raises(LaunchError, match="^claude is not installed: npm install -g @anthropic-ai/claude-code$"):
        launch(["claude", "--", "-p", "hi"])
    assert cli.main(["launch", "nobody"]) == 1
    assert "name an agent: glmserve launch {claude,codex,opencode}" in capsys.readouterr().err


def test_serve_on_an_inherited_socket_takes_no_host_or_port(capsys):
    from glmserve.flags import parse_flags
    from glmserve.settings.serve import DeploySettings

    assert parse_flags(DeploySettings, ["--fd", "3"]).fd == 3
    with pytest.raises(SystemExit):
        parse_flags(DeploySettings, ["--fd", "3", "--port", "5"])
    assert capsys.readouterr().err.strip().endswith(
        "error: --fd serves a socket that is bound already: --host and --port cannot apply to it")
