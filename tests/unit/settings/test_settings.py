"""Settings per engine: ``LlamaCppSettings``, ``TransformersSettings`` and ``VllmSettings`` own
their fields and defaults and compose into ``ServeSettings`` with the same flat flags and
``GLMSERVE_*`` variables as before; each engine's ``SETTINGS`` is its class's fields; the help
groups the flags (server, model, answers, engine, limits, connections, models, state,
scale-out)."""

from __future__ import annotations

import re

import pytest

from glmserve.flags import parse_flags
from glmserve.engine import ENGINES, EngineError, check_engine_settings, engine_settings
from glmserve.engine.settings import own_fields
from glmserve.settings.model import ENGINE_SETTINGS
from glmserve.settings.serve import DeploySettings, ServeSettings

# what each engine reads (flat ServeSettings + SETTINGS name sets): unchanged by the split into classes;
# vllm reads --speculative and its flags since they map to its ngram and draft_model speculative_config
BEFORE = {
    "llama_cpp": {"n_threads", "max_num_batched_tokens", "kv_layout", "speculative", "spec_ngram_min",
                  "spec_ngram_max", "spec_draft_max", "draft_model", "batch_invariant", "cache_ram", "runner", "mmproj",
                  "spec_ngram_cost", "cache_type_k", "cache_type_v", "n_gpu_layers", "split_mode", "tensor_split",
                  "main_gpu", "cpu_moe", "n_cpu_moe", "override_tensor", "no_mmap", "mlock", "fit", "fit_target", "rpc", "n_gpu_layers_draft",
                  "fit_ctx", "no_mmproj_offload", "stream_interval_ms"},
    "transformers": {"dtype", "device", "trust_remote_code", "n_threads", "stream_interval_ms"},
    "vllm": {"dtype", "trust_remote_code", "max_num_batched_tokens", "tensor_parallel_size", "pipeline_parallel_size",
             "distributed_executor_backend", "gpu_memory_utilization", "kv_cache_memory", "enforce_eager", "engine_arg",
             "speculative", "spec_ngram_min", "spec_ngram_max", "spec_draft_max", "draft_model", "batch_invariant", "scheduling_policy"},
}


def test_each_engine_owns_its_fields():
    assert list(ENGINE_SETTINGS) == list(ENGINES)
    for engine, cls in ENGINE_SETTINGS.items():
        assert own_fields(cls) == BEFORE[engine] == set(engine_settings(engine))
        assert set(cls.model_fields) <= set(ServeSettings.model_fields)


def test_llama_cpp_batch_size_and_prompt_cache_in_force():
    from glmserve.engine.llama_cpp import in_force

    default = in_force(ServeSettings())
    assert (default.max_num_batched_tokens, default.cache_ram) == (512, 2048)
    assert in_force(ServeSettings(batch_invariant=True)).max_num_batched_tokens == 63
    assert in_force(ServeSettings(batch_invariant=True, max_num_batched_tokens=32)).max_num_batched_tokens == 32
    assert in_force(ServeSettings(max_num_batched_tokens=2048)).max_num_batched_tokens == 2048
    with pytest.raises(EngineError, match="--max-num-batched-tokens 64 is over 63, where llama.cpp's CPU kernels"):
        in_force(ServeSettings(batch_invariant=True, max_num_batched_tokens=64))
    assert in_force(ServeSettings(kv_layout="unified")).cache_ram == 0
    assert in_force(ServeSettings(kv_layout="unified", cache_ram=0)).cache_ram == 0
    with pytest.raises(EngineError, match="--cache-ram needs --kv-layout split"):
        in_force(ServeSettings(kv_layout="unified", cache_ram=64))
    for flag in ("batch_invariant", "cache_ram"):
        with pytest.raises(EngineError, match=f"--{flag.replace('_', '-')} is not used by the transformers engine"):
            check_engine_settings(ServeSettings(engine="transformers", **{flag: 1}))
    with pytest.raises(EngineError, match="--stream-interval-ms is not used by the vllm engine"):
        check_engine_settings(ServeSettings(engine="vllm", stream_interval_ms=0))


def test_a_field_two_engines_read_is_the_same_field():
    seen = {}
    for cls in ENGINE_SETTINGS.values():
        for name, info in cls.model_fields.items():
            if name in seen:
                other = seen[name]
                assert (info.annotation, info.get_default(call_default_factory=True), info.description,
                        info.metadata) == (other.annotation, other.get_default(call_default_factory=True),
                                           other.description, other.metadata), name
            seen[name] = info


def test_defaults_flags_and_environment_unchanged(monkeypatch):
    s = ServeSettings()
    assert (s.engine, s.dtype, s.device, s.kv_layout, s.max_num_batched_tokens, s.tensor_parallel_size,
            s.gpu_memory_utilization, s.enforce_eager, s.engine_arg) == \
        ("llama_cpp", "auto", "auto", "auto", None, 1, 0.9, False, [])
    monkeypatch.setenv("GLMSERVE_KV_LAYOUT", "unified")
    monkeypatch.setenv("GLMSERVE_N_THREADS", "3")
    parsed = parse_flags(DeploySettings, ["--engine", "vllm", "--tensor-parallel-size", "2", "--enforce-eager",
                                         "--engine-arg", "block_size=32", "--dtype", "float16"])
    assert (parsed.engine, parsed.tensor_parallel_size, parsed.enforce_eager, parsed.engine_arg, parsed.dtype,
            parsed.kv_layout, parsed.n_threads) == ("vllm", 2, True, ["block_size=32"], "float16", "unified", 3)
    assert parsed.model_fields_set >= {"tensor_parallel_size", "enforce_eager", "engine_arg", "dtype", "kv_layout"}


def test_list_flags_read_from_the_environment_as_on_the_command_line(monkeypatch):
    """GLMSERVE_RPC and GLMSERVE_TENSOR_SPLIT take llama-server's comma lists (a JSON list was needed)."""
    monkeypatch.setenv("GLMSERVE_RPC", "10.0.0.2:50052,10.0.0.3:50052")
    monkeypatch.setenv("GLMSERVE_TENSOR_SPLIT", "3,1")
    parsed = parse_flags(DeploySettings, [])
    assert (parsed.rpc, parsed.tensor_split) == (["10.0.0.2:50052", "10.0.0.3:50052"], [3.0, 1.0])


def test_an_on_off_flag_named_no_something_is_on_as_given():
    """argparse's on/off flags turn anything starting with --no- off: --no-mmap set no_mmap to
    False (the model was mapped all the same)."""
    given = parse_flags(DeploySettings, ["--no-mmap", "--no-mmproj-offload", "--mlock", "--no-ui"])
    assert (given.no_mmap, given.no_mmproj_offload, given.mlock, given.ui) == (True, True, True, False)
    undone = parse_flags(DeploySettings, ["--no-no-mmap", "--no-mlock", "--ui"])
    assert (undone.no_mmap, undone.mlock, undone.ui) == (False, False, True)


@pytest.mark.parametrize("args, message", [
    (["--engine-arg", "block size"], "expected KEY=VALUE"),
    (["--tensor-parallel-size", "0"], "greater than or equal to 1"),
    (["--kv-layout", "ring"], "kv_layout"),
    (["--n-threads", "0"], "n_threads"),
    (["--replicas", "2", "--allow-runtime-lora-updating"], "one replica only"),
    (["--replicas", "2", "--models-dir", "/tmp"], "serve one model each"),
    (["--max-loaded-models", "2"], "--max-loaded-models needs several models"),
    (["--keep-alive", "1m"], "--keep-alive needs several models"),
    (["--spec-draft-max", "8"], "--spec-draft-max needs --speculative"),
    (["--speculative", "ngram", "--spec-ngram-min", "5"], "--spec-ngram-min is larger than --spec-ngram-max"),
    (["--speculative", "draft"], "--speculative draft needs --draft-model"),
    (["--speculative", "eagle"], "speculative"),
    (["--draft-model", "x.gguf"], "--draft-model needs --speculative"),
    (["--override-generation-config", '{"max_new_tokens": 0}'], "max_new_tokens: a whole number"),
    (["--override-generation-config", '{"max_new_tokens": 2.5}'], "max_new_tokens: a whole number"),
    (["--override-generation-config", '{"max_length": 5}'], "max_length: not a sampling field"),
    (["--speculative", "ngram", "--draft-model", "x.gguf"], "--draft-model is for --speculative draft"),
    (["--speculative", "draft", "--draft-model", "x.gguf", "--spec-ngram-max", "3"],
     "--spec-ngram-max is for --speculative ngram, not draft"),
    (["--speculative", "mtp", "--draft-model", "x.gguf"], "--draft-model is for --speculative draft, not mtp"),
    (["--speculative", "mtp", "--spec-ngram-min", "1"], "--spec-ngram-min is for --speculative ngram, not mtp"),
])
def test_engine_field_validation_still_applies(args, message, capsys):
    with pytest.raises(SystemExit) as exc:
        parse_flags(DeploySettings, args)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_help_lists_the_flag_groups_one_line_per_flag(capsys):
    with pytest.raises(SystemExit):
        parse_flags(DeploySettings, ["--help"])
    out = capsys.readouterr().out
    titles = re.findall(r"^([a-z-]+):$", out, re.M)
    assert titles == ["options", "server", "model", "answers", "engine", "limits", "connections", "models", "state",
                      "scale-out"]
    sections = dict(zip(titles, re.split(r"^[a-z-]+:$", out, flags=re.M)[1:]))
    engine_flags = set(re.findall(r"^  --([a-z-]+)", sections["engine"], re.M))
    assert engine_flags == {n.replace("_", "-") for cls in ENGINE_SETTINGS.values() for n in own_fields(cls)}
    for title, flags in (("server", ("--host", "--port", "--api-key")), ("model", ("--model", "--n-ctx", "--lora")),
                         ("scale-out", ("--replicas", "--ray-address", "--min-replicas"))):
        for flag in flags:
            assert re.search(rf"^  {flag}\b", sections[title], re.M), flag
    # each flag's help is one line that ends in its default, on the flag's line or the next
    helps = [line for line in out.splitlines() if "(default: " in line]
    assert len(helps) == len(DeploySettings.model_fields)
    assert all(line.endswith(")") for line in helps)

