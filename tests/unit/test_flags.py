"""``flags.flag_groups``: every ``glmserve serve`` flag in exactly one group, with one line of
help that ends in its default; the order ``--help`` prints."""

from __future__ import annotations

import pytest

from glmserve.flags import SERVE_GROUPS, flag_groups
from glmserve.settings import BenchSettings, ChatSettings, DeploySettings, ServeSettings


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
    assert titles == [title for title, _, _ in SERVE_GROUPS]
    for _, _, fields in SERVE_GROUPS:
        assert set(fields) <= set(ServeSettings.model_fields)
    engine = next(g for g in flag_groups(DeploySettings) if g.title == "engine")
    assert [f.name for f in engine.flags][:2] == ["engine", "max_num_seqs"]
    scale_out = next(g for g in flag_groups(DeploySettings) if g.title == "scale-out")
    assert {f.name for f in scale_out.flags} == set(DeploySettings.model_fields) - set(ServeSettings.model_fields)


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
