"""``flags.flag_groups``: every ``glmserve serve`` flag in exactly one group, with one line of
help that ends in its default; the order ``--help`` prints."""

from __future__ import annotations

import pytest

from glmserve.engine.settings import own_fields
from glmserve.flags import SERVE_GROUPS, flag_groups, serve_group_fields
from glmserve.settings.bench import BenchSettings
from glmserve.settings.model import ENGINE_SETTINGS, ModelSettings
from glmserve.settings.serve import ChatSettings, DeploySettings, ServeSettings
from glmserve.settings.server import ServerSettings


@pytest.mark.parametrize("cls", [DeploySettings, ServeSettings, ChatSettings, BenchSettings])
def test_every_flag_is_in_one_group_with_one_line_of_help(cls):
    groups = flag_groups(cls)
    names = [flag.name for group in groups for flag in group.flags]
    assert sorted(names) == sorted(f.alias or n for n, f in cls.model_fields.items())
    for group in groups:
        for flag in group.flags:
            assert "\n" not in flag.help and flag.help.endswith(")"), flag
            sentence, _, default = flag.help.rpartition(" (default: ")
            assert sentence.endswith(".") and len(sentence) <= 140, flag  # one line on a terminal or two
            assert default.strip(") "), flag
            assert flag.flag.startswith("--") and flag.env.startswith("GLMSERVE_"), flag


def test_serve_groups_in_order_and_named_fields_exist():
    titles = [group.title for group in flag_groups(DeploySettings)]
    assert titles == [title for title, _ in SERVE_GROUPS]
    for _, _, fields in serve_group_fields():
        assert set(fields) <= set(DeploySettings.model_fields)
    model = next(g for g in flag_groups(DeploySettings) if g.title == "model")
    assert [f.name for f in model.flags][:2] == ["model", "engine"]
    engine = next(g for g in flag_groups(DeploySettings) if g.title == "engine")
    assert {f.name for f in engine.flags} == {n for cls in ENGINE_SETTINGS.values() for n in own_fields(cls)}
    scale_out = next(g for g in flag_groups(DeploySettings) if g.title == "scale-out")
    assert {f.name for f in scale_out.flags} == set(DeploySettings.model_fields) - set(ServeSettings.model_fields)


def test_each_field_is_the_servers_or_one_models_and_in_one_group():
    server = set(ServerSettings.model_fields) | (set(DeploySettings.model_fields) - set(ServeSettings.model_fields))
    model = set(ModelSettings.model_fields)
    assert server.isdisjoint(model) and server | model == set(DeploySettings.model_fields)
    grouped = [n for _, _, fields in serve_group_fields() for n in fields]
    assert sorted(grouped) == sorted(DeploySettings.model_fields)  # each in exactly one group
    for title, _, fields in serve_group_fields():  # and a group is the server's or a model's
        assert set(fields) <= server or set(fields) <= model, title


def test_defaults_read_as_users_write_them():
    flags = {f.name: f for g in flag_groups(DeploySettings) for f in g.flags}
    assert flags["port"].help.endswith("(default: 8000)") and flags["port"].metavar == "N"
    assert flags["ui"].help.endswith("(default: on)") and flags["ui"].metavar is None
    assert flags["n_threads"].help.endswith("(default: all CPUs)")  # a computed default, not this machine's
    assert flags["state_dir"].help.endswith("(default: $XDG_DATA_HOME/glmserve, else ~/.local/share/glmserve)")
    assert flags["engine"].metavar == "{llama_cpp,transformers,vllm}"
    assert flags["distributed_executor_backend"].metavar == "{mp,ray}"
    assert flags["lora"].metavar == "NAME=PATH" and flags["lora"].env == "GLMSERVE_LORA"
    bench = {f.name: f for g in flag_groups(BenchSettings) for f in g.flags}
    assert bench["json"].flag == "--json" and bench["concurrency"].help.endswith("(default: 1)")
    assert bench["model"].env == "GLMSERVE_BENCH_MODEL" and bench["model"].help.endswith("(default: none)")
