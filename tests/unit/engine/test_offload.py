"""GPU offload on llama_cpp (``engine/llama_cpp/loading/offload.py``): the flags reach llama.cpp's model
parameters with llama-server's meanings, this CPU build reports no layer offloaded, ``auto``
fits layers to the GPUs' free memory, and bad values are one-line errors."""

from __future__ import annotations

import ctypes

import llama_cpp
import pytest
from pydantic import ValidationError

from glmserve.engine.base import EngineError
from glmserve.engine.llama_cpp.loading.offload import (EXPERTS, RESERVE, Device, Offload, _TensorOverride, apply, devices,
                                               plan_offload)
from glmserve.engine.llama_cpp.settings import LlamaCppSettings

GIB = 2**30
GPU = Device("CUDA0", "NVIDIA H200", "GPU", "CUDA", "CUDA0", 10 * GIB, 140 * GIB)
CPU = Device("CPU", "AMD EPYC", "CPU", "CPU", "CPU", 20 * GIB, 24 * GIB)


@pytest.fixture
def gpu_build(monkeypatch):
    """llama.cpp as a GPU build answers (the devices are given to ``plan_offload``)."""
    monkeypatch.setattr(llama_cpp, "llama_supports_gpu_offload", lambda: True)


def test_this_cpu_build_has_the_cpu_alone_and_offloads_nothing():
    found = devices()
    assert [(d.name, d.kind, d.backend, d.buffer) for d in found] == [("CPU", "CPU", "CPU", "CPU")]
    assert not llama_cpp.llama_supports_gpu_offload()
    for asked in ("auto", "all", 20):
        offload = plan_offload(LlamaCppSettings(n_gpu_layers=asked), 47, 100 << 20, 1 << 30)
        assert (offload.backend, offload.n_gpu_layers, offload.n_layer) == ("CPU", 0, 47)
    assert "0 of 48 layers offloaded" in offload.describe()


def test_a_gpu_build_offloads_all_a_number_or_what_fits(gpu_build):
    weights, kv = 48 * (100 << 20), 47 * (20 << 20)  # 100 MiB of weights and 20 MiB of KV cache a layer
    assert plan_offload(LlamaCppSettings(n_gpu_layers="all"), 47, weights, kv, [CPU, GPU]).n_gpu_layers == 48
    assert plan_offload(LlamaCppSettings(n_gpu_layers=10), 47, weights, kv, [CPU, GPU]).n_gpu_layers == 10
    assert plan_offload(LlamaCppSettings(n_gpu_layers=99), 47, weights, kv, [CPU, GPU]).n_gpu_layers == 48
    roomy = plan_offload(LlamaCppSettings(), 47, weights, kv, [CPU, GPU])  # 10 GiB free: every layer fits
    assert (roomy.backend, roomy.n_gpu_layers) == ("CUDA", 48)
    small = Device("CUDA0", "a small GPU", "GPU", "CUDA", "CUDA0", 2 * GIB, 4 * GIB)
    n = plan_offload(LlamaCppSettings(), 47, weights, kv, [CPU, small]).n_gpu_layers
    # what n layers take fits beside the reserve, one layer more would not
    assert n * (120 << 20) <= 2 * GIB - RESERVE < (n + 1) * (120 << 20)
    assert plan_offload(LlamaCppSettings(n_gpu_layers=0), 47, weights, kv, [CPU, GPU]).backend == "CPU"


def test_choices_that_do_not_fit_the_machine_are_refused(gpu_build):
    with pytest.raises(EngineError, match="--main-gpu 1: this machine has 1 GPU"):
        plan_offload(LlamaCppSettings(main_gpu=1), 47, 1, 1, [CPU, GPU])
    with pytest.raises(EngineError, match="--tensor-split gives 2 parts for 1 GPU"):
        plan_offload(LlamaCppSettings(tensor_split="3,1"), 47, 1, 1, [CPU, GPU])
    with pytest.raises(EngineError, match="--batch-invariant is measured on llama.cpp's CPU backend only; with 48 "
                                          "layers on CUDA"):
        plan_offload(LlamaCppSettings(batch_invariant=True), 47, 1, 1, [CPU, GPU])
    assert plan_offload(LlamaCppSettings(batch_invariant=True, n_gpu_layers=0), 47, 1, 1, [CPU, GPU]).n_gpu_layers == 0


@pytest.mark.parametrize("flags, load_mode", [({}, None), ({"no_mmap": True}, llama_cpp.LLAMA_LOAD_MODE_NONE),
                                              ({"mlock": True}, llama_cpp.LLAMA_LOAD_MODE_MMAP_MLOCK),
                                              ({"no_mmap": True, "mlock": True}, llama_cpp.LLAMA_LOAD_MODE_MLOCK)])
def test_the_flags_reach_llama_cpps_model_parameters(flags, load_mode):
    settings = LlamaCppSettings(split_mode="row", main_gpu=0, tensor_split="3,1", n_cpu_moe=2,
                                override_tensor=[r"token_embd\.weight=CPU"], **flags)
    params = llama_cpp.llama_model_default_params()
    default_load = params.load_mode
    offload = Offload("CUDA", ("CPU", "CUDA0"), 30, 47, (
        (r"token_embd\.weight", "CPU"), (rf"blk\.0{EXPERTS}", "CPU"), (rf"blk\.1{EXPERTS}", "CPU")))
    keep = apply(params, settings, offload)
    assert (params.n_gpu_layers, params.split_mode, params.main_gpu) == (30, llama_cpp.LLAMA_SPLIT_MODE_ROW, 0)
    assert params.load_mode == (default_load if load_mode is None else load_mode)
    assert [params.tensor_split[i] for i in range(3)] == [3.0, 1.0, 0.0]
    array = ctypes.cast(params.tensor_buft_overrides, ctypes.POINTER(_TensorOverride))
    patterns = [array[i].pattern.decode() for i in range(3)]
    assert patterns == [r"token_embd\.weight", r"blk\.0\.ffn_(up|down|gate|gate_up)_(ch|)exps",
                        r"blk\.1\.ffn_(up|down|gate|gate_up)_(ch|)exps"]
    assert len({array[i].buft for i in range(3)}) == 1 and array[0].buft  # the CPU buffer type
    assert array[3].pattern is None  # the list's end
    assert keep


def test_cpu_moe_and_n_cpu_moe_keep_llama_servers_expert_patterns():
    every = plan_offload(LlamaCppSettings(cpu_moe=True), 47, 1, 1)
    assert every.overrides == ((r"\.ffn_(up|down|gate|gate_up)_(ch|)exps", "CPU"),)
    first = plan_offload(LlamaCppSettings(n_cpu_moe=100), 3, 1, 1)  # at most every layer
    assert [p for p, _ in first.overrides] == [rf"blk\.{i}{EXPERTS}" for i in range(3)]


def test_an_unknown_buffer_type_names_the_ones_there_are():
    params = llama_cpp.llama_model_default_params()
    offload = plan_offload(LlamaCppSettings(override_tensor=["exps=CUDA0"]), 47, 1, 1)
    with pytest.raises(EngineError, match=r"no buffer type 'CUDA0' in this build of llama.cpp \(it has: CPU\)"):
        apply(params, LlamaCppSettings(), offload)


@pytest.mark.parametrize("flags, message", [
    ({"n_gpu_layers": "most"}, "'most': expected a number of layers, auto or all"),
    ({"n_gpu_layers": -1}, "-1: expected 0 or more layers, auto or all"),
    ({"tensor_split": "3,x"}, "expected shares such as 3,1"),
    ({"override_tensor": ["exps"]}, "expected PATTERN=BUFFER"),
    ({"override_tensor": ["(exps=CPU"]}, "is not a regular expression"),
    ({"cpu_moe": True, "n_cpu_moe": 4}, "give it or --n-cpu-moe, not both"),
])
def test_bad_values_are_one_line_errors(flags, message):
    with pytest.raises(ValidationError, match=message):
        LlamaCppSettings(**flags)
