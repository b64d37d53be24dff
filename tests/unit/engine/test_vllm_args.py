"""glmserve settings -> vLLM engine arguments, and the LoRA adapter checks (no model is loaded)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from glmserve.engine.base import EngineError
from glmserve.engine.vllm.args import engine_args, parse_engine_args
from glmserve.engine.peft_lora import check_adapter, lora_rank
from glmserve.models import ModelNotFoundError
from glmserve.settings.serve import ServeSettings

pytest.importorskip("vllm")
safetensors_numpy = pytest.importorskip("safetensors.numpy")
np = pytest.importorskip("numpy")


def _settings(**kw) -> ServeSettings:
    return ServeSettings(engine="vllm", model="/models/x", **kw)


def test_flags_map_to_vllm_names():
    config = _settings(n_ctx=2048, max_num_seqs=4, tensor_parallel_size=2,
                       pipeline_parallel_size=3, distributed_executor_backend="ray",
                       gpu_memory_utilization=0.5, kv_cache_memory=1 << 30,
                       enforce_eager=True, dtype="float32", scheduling_policy="priority",
                       engine_arg=["block_size=32", "kv_cache_dtype=auto"])
    args = engine_args(Path("/models/x"), config)
    assert (args.model, args.max_model_len, args.max_num_seqs, args.dtype) == ("/models/x", 2048, 4, "float32")
    assert (args.tensor_parallel_size, args.pipeline_parallel_size, args.distributed_executor_backend) == (2, 3, "ray")
    assert (args.gpu_memory_utilization, args.kv_cache_memory_bytes, args.enforce_eager) == (0.5, 1 << 30, True)
    assert (args.block_size, args.kv_cache_dtype, args.enable_prefix_caching) == (32, "auto", True)
    assert args.scheduling_policy == "priority" and _vllm_default("scheduling_policy") == "fcfs"
    assert not args.enable_lora


def _vllm_default(name: str):
    return engine_args(Path("/models/x"), _settings()).__getattribute__(name)


def test_unset_n_ctx_max_num_seqs_and_batched_tokens_are_vllms_defaults():
    args = engine_args(Path("/models/x"), _settings())
    assert args.max_model_len is None and args.max_num_seqs is None and args.max_num_batched_tokens is None


def test_engine_args_parse_json_values_and_refuse_unknown_or_flag_backed_keys():
    assert parse_engine_args(["a=1", "b=true", "c=fp8", 'd={"x": 1}']) == {"a": 1, "b": True, "c": "fp8", "d": {"x": 1}}
    with pytest.raises(EngineError, match="no_such_arg: not a vLLM engine argument"):
        engine_args(Path("/m"), _settings(engine_arg=["no_such_arg=1"]))
    with pytest.raises(EngineError, match="max_model_len: glmserve sets it"):
        engine_args(Path("/m"), _settings(engine_arg=["max_model_len=10"]))
    assert engine_args(Path("/m"), _settings(engine_arg=["enable_prefix_caching=false"])).enable_prefix_caching is False
    with pytest.raises(ValueError, match="KEY=VALUE"):
        _settings(engine_arg=["no-equals"])


def test_speculative_ngram_is_vllms_ngram_speculative_config():
    config = _settings(speculative="ngram", spec_ngram_min=3, spec_ngram_max=6,
                       spec_draft_max=5)
    assert engine_args(Path("/models/x"), config).speculative_config == {
        "method": "ngram", "prompt_lookup_min": 3, "prompt_lookup_max": 6, "num_speculative_tokens": 5}
    assert engine_args(Path("/models/x"), _settings()).speculative_config is None
    # --speculative mtp: the checkpoint's own MTP layers (vLLM's method "mtp")
    config = _settings(speculative="mtp", spec_draft_max=2)
    assert engine_args(Path("/models/x"), config).speculative_config == {"method": "mtp", "num_speculative_tokens": 2}
    # unless given, one token per step, as vLLM's GLM recipes draft from GLM's one NextN layer
    assert engine_args(Path("/models/x"), _settings(speculative="mtp")).speculative_config == {
        "method": "mtp", "num_speculative_tokens": 1}
    # vLLM's other methods stay reachable through --engine-arg, but not beside --speculative
    draft = {"method": "draft_model", "model": "/models/small", "num_speculative_tokens": 3}
    given = [f"speculative_config={json.dumps(draft)}"]
    assert engine_args(Path("/m"), _settings(engine_arg=given)).speculative_config == draft
    with pytest.raises(EngineError, match="speculative_config: glmserve sets it"):
        engine_args(Path("/m"), _settings(speculative="mtp", engine_arg=given))


def test_speculative_draft_is_vllms_draft_model_speculative_config(tmp_path):
    (tmp_path / "small").mkdir()
    (tmp_path / "small" / "config.json").write_text("{}")
    config = _settings(speculative="draft", draft_model=str(tmp_path / "small"),
                       spec_draft_max=4)
    assert engine_args(Path("/models/x"), config).speculative_config == {
        "method": "draft_model", "model": str(tmp_path / "small"), "num_speculative_tokens": 4}
    with pytest.raises(ModelNotFoundError, match="--draft-model .*nope"):
        engine_args(Path("/models/x"), _settings(speculative="draft", draft_model=str(tmp_path / "nope")))


def _adapter(folder: Path, r: int, shapes: dict[str, tuple[int, int]]) -> Path:
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"r": r, "lora_alpha": 16}))
    safetensors_numpy.save_file({k: np.zeros(v, dtype=np.float32) for k, v in shapes.items()},
                                str(folder / "adapter_model.safetensors"))
    return folder


@pytest.fixture
def model(tmp_path) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    safetensors_numpy.save_file({"model.layers.0.self_attn.q_proj.weight": np.zeros((8, 6), dtype=np.float32)},
                                str(folder / "model.safetensors"))
    return folder


def test_adapter_that_fits_passes_and_its_rank_is_rounded_up(tmp_path, model):
    key = "base_model.model.model.layers.0.self_attn.q_proj"
    adapter = _adapter(tmp_path / "ok", 4, {f"{key}.lora_A.weight": (4, 6), f"{key}.lora_B.weight": (8, 4)})
    check_adapter("ok", adapter, model)
    assert lora_rank(adapter) == 4
    args = engine_args(model, _settings(lora=[f"ok={adapter}"]))
    assert (args.enable_lora, args.max_loras, args.max_lora_rank) == (True, 1, 8)


@pytest.mark.parametrize(("shapes", "why"), [
    ({"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": (4, 5)}, r"is \[4, 5\], the model's"),
    ({"base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": (7, 4)}, r"is \[7, 4\], the model's"),
    ({"base_model.model.model.layers.9.mlp.up_proj.lora_A.weight": (4, 6)}, "the model has no model.layers.9"),
])
def test_adapter_that_does_not_fit_is_refused(tmp_path, model, shapes, why):
    adapter = _adapter(tmp_path / "bad", 4, shapes)
    with pytest.raises(EngineError, match="LoRA adapter 'bad' .* does not match the base model: .*" + why):
        check_adapter("bad", adapter, model)


def test_a_folder_without_adapter_config_is_refused(tmp_path, model):
    with pytest.raises(EngineError, match="LoRA adapter 'x': .* not a PEFT adapter folder"):
        check_adapter("x", tmp_path, model)
