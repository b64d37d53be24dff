"""``glmserve launch`` (``launch.py``): how each agent is pointed at the server, the words
before and after ``--``, and the one-line error for an agent not installed. End to end with the
real agents: ``tests/e2e/test_launch.py``."""

from __future__ import annotations

import json
import tomllib

import pytest

from glmserve import cli
from glmserve.launch import LaunchError, agent_setup, launch, split_args


def test_the_words_before_and_after_the_double_dash():
    assert split_args(["--model", "o/m", "--", "-p", "hi"]) == (None, ["--model", "o/m"], ["-p", "hi"])
    assert split_args(["--url", "http://h:1/", "--", "exec", "--", "x"]) == ("http://h:1", [], ["exec", "--", "x"])
    assert split_args([]) == (None, [], [])
    with pytest.raises(LaunchError, match="--url needs a URL"):
        split_args(["--url"])


def test_each_agent_is_pointed_at_the_server_and_told_its_context(tmp_path):
    env, lead = agent_setup("claude", "http://h:1", "o/m", "k", tmp_path, 65536)
    assert lead == [] and env["ANTHROPIC_BASE_URL"] == "http://h:1" and env["ANTHROPIC_API_KEY"] == "k"
    roles = ("ANTHROPIC_MODEL", "ANTHROPIC_DEFAULT_HAIKU_MODEL", "CLAUDE_CODE_SUBAGENT_MODEL")
    assert {env[k] for k in roles} == {"o/m"}
    assert env["CLAUDE_CODE_ATTRIBUTION_HEADER"] == "0" and env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert (env["CLAUDE_CODE_AUTO_COMPACT_WINDOW"], env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"]) == ("65536", "16384")
    env, _ = agent_setup("codex", "http://h:1", "o/m", "k", tmp_path, 65536)
    config = tomllib.loads((tmp_path / "codex" / "config.toml").read_text())
    assert env == {"CODEX_HOME": str(tmp_path / "codex"), "GLMSERVE_API_KEY": "k"}
    assert config["model"] == "o/m" and config["model_provider"] == "glmserve"
    assert (config["model_context_window"], config["model_auto_compact_token_limit"]) == (65536, 58982)
    assert config["model_providers"]["glmserve"] == {"name": "glmserve", "base_url": "http://h:1/v1",
                                                    "wire_api": "responses", "env_key": "GLMSERVE_API_KEY"}
    env, _ = agent_setup("opencode", "http://h:1", "o/m", "k", tmp_path, 202752)
    config = json.loads((tmp_path / "opencode.json").read_text())
    assert env == {"OPENCODE_CONFIG": str(tmp_path / "opencode.json")} and config["model"] == "glmserve/o/m"
    assert config["provider"]["glmserve"]["options"] == {"baseURL": "http://h:1/v1", "apiKey": "k"}
    assert config["provider"]["glmserve"]["models"]["o/m"]["limit"] == {"context": 202752, "output": 32768}


def test_an_agent_not_installed_is_named_with_its_npm_package(monkeypatch, capsys):
    monkeypatch.setenv("PATH", "")
    with pytest.raises(LaunchError, match="^claude is not installed: npm install -g @anthropic-ai/claude-code$"):
        launch(["claude", "--", "-p", "hi"])
    assert cli.main(["launch", "nobody"]) == 1
    assert "name an agent: glmserve launch {claude,codex,opencode}" in capsys.readouterr().err
