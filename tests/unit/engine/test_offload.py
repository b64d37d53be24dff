"""GPU offload on llama_cpp (``engine/llama_cpp/loading/``): the flags reach llama.cpp's model
parameters with llama-server's meanings, this CPU build reports no layer offloaded, the devices
llama.cpp offloads to and the layers each gets follow llama.cpp's rules (``llama_model_load``,
``load_tensors``), a split GGUF is counted whole, libggml is found under each platform's name, and
bad values are one-line errors. The placement on real devices is ``tests/e2e/test_offload_devices.py``."""

from __future__ import annotations

import ctypes
import ctypes.util
import shutil
import sys

import llama_cpp
import pytest
from pydantic import ValidationError

from glmserve.engine.base import EngineError
from glmserve.engine.llama_cpp.loading import devices as devices_module
from glmserve.engine.llama_cpp.loading.devices import Device, add_rpc_servers, devices, ggml
from glmserve.engine.llama_cpp.loading.experts import Slot, fill_experts, held
from glmserve.engine.llama_cpp.loading.experts import overrides as partial_overrides
from glmserve.engine.llama_cpp.loading.fit import (MIB, Devices, LayerBytes, assign_layers, fill_layers, fit_layers,
                                                   place)
from glmserve.engine.llama_cpp.loading.offload import (EXPERTS, Offload, _TensorOverride, apply, draft_gpu_layers,
                                                   offload_devices, plan_offload)
from glmserve.engine.llama_cpp.settings import LlamaCppSettings
from glmserve.models import gguf_bytes, gguf_shards

GIB = 2**30
GPU = Device("CUDA0", "NVIDIA H200", "GPU", "CUDA", "CUDA0", 10 * GIB, 140 * GIB)
CPU = Device("CPU", "AMD EPYC", "CPU", "CPU", "CPU", 20 * GIB, 24 * GIB)
IGPU = Device("Vulkan1", "AMD Radeon Graphics", "IGPU", "Vulkan", "Vulkan1", 8 * GIB, 8 * GIB)
RPC = Device("RPC0", "10.0.0.2:50052", "GPU", "RPC", "RPC0[10.0.0.2:50052]", 20 * GIB, 24 * GIB)
SIZES = LayerBytes((100 * MIB,) * 47, 100 * MIB, 50 * MIB)  # 47 layers of 100 MiB and the output layer


def test_this_build_offloads_to_its_gpus_only():
    """On a CPU build (the header pytest prints names the devices) nothing is offloaded, whatever is
    asked; on a GPU build ``all`` offloads every layer to the first GPU's backend."""
    found = devices()
    assert [(d.name, d.backend, d.buffer) for d in found if d.kind == "CPU"] == [("CPU", "CPU", "CPU")]
    gpus = offload_devices(LlamaCppSettings(), found)
    if not gpus:
        for asked in ("auto", "all", 20):
            offload = plan_offload(LlamaCppSettings(n_gpu_layers=asked), SIZES, 1 << 30)
            assert (offload.backend, offload.n_gpu_layers, offload.n_layer, offload.placement) == ("CPU", 0, 47, ())
        assert "0 of 48 layers offloaded" in offload.describe()
    else:
        offload = plan_offload(LlamaCppSettings(n_gpu_layers="all"), SIZES, 1 << 30)
        assert (offload.backend, offload.n_gpu_layers) == (gpus[0].backend, 48)


def test_llama_cpp_offloads_the_last_layers_by_cumulative_shares():
    # llama_model::load_tensors: the last n of n_layer + 1 layers; layer il to the first device whose
    # cumulative share passes (il - first) / n
    assert assign_layers(5, 4, [1.0]) == [[0, 1, 2, 3, 4]]
    assert assign_layers(5, 4, [1.0, 1.0]) == [[0, 1, 2], [3, 4]]
    assert assign_layers(3, 4, [1.0, 1.0]) == [[2, 3], [4]]
    assert assign_layers(4, 7, [3.0, 1.0]) == [[4, 5, 6], [7]]
    assert assign_layers(0, 4, [1.0]) == [[]]
    assert assign_layers(99, 4, [1.0, 0.0]) == [[0, 1, 2, 3, 4], []]


def test_the_devices_offloaded_to_are_llama_cpps():
    settings = LlamaCppSettings()
    assert offload_devices(settings, [CPU, GPU, RPC]) == [RPC, GPU]  # RPC devices first
    assert offload_devices(settings, [CPU, GPU, IGPU]) == [GPU]  # an iGPU beside a discrete GPU is not used
    assert offload_devices(settings, [CPU, IGPU, RPC]) == [RPC, IGPU]  # RPC devices do not count as discrete
    assert offload_devices(LlamaCppSettings(split_mode="none", main_gpu=1), [CPU, GPU, RPC]) == [GPU]
    assert offload_devices(settings, [CPU]) == []


def test_auto_fits_each_device_beside_its_margin_and_compute():
    small = Device("CUDA1", "a small GPU", "GPU", "CUDA", "CUDA1", 2 * GIB, 4 * GIB)
    kv = 47 * 20 * MIB  # 20 MiB of KV cells a layer
    roomy = plan_offload(LlamaCppSettings(), SIZES, kv, [CPU, GPU], [100 * MIB])
    assert (roomy.backend, roomy.n_gpu_layers) == ("CUDA", 48)
    one = plan_offload(LlamaCppSettings(), SIZES, kv, [CPU, small], [100 * MIB])
    # 2 GiB less the 1 GiB margin and 100 MiB of compute: 924 MiB, 7 layers of 120 MiB (the output layer has no KV)
    assert one.n_gpu_layers == 7 and one.placement[0].fits
    assert one.placement[0].weights + one.placement[0].kv == 100 * MIB + 6 * 120 * MIB
    assert plan_offload(LlamaCppSettings(fit_target=0), SIZES, kv, [CPU, small], [100 * MIB]).n_gpu_layers == 16
    # two devices: each fits its own share, not the sum of their memory
    two = plan_offload(LlamaCppSettings(tensor_split="1,1"), SIZES, kv, [CPU, GPU, small], [100 * MIB] * 2)
    # (the last layers, with the output layer, on the second: 7 of them fill its 924 MiB)
    assert [d.layers for d in two.placement] == [8, 7] and all(d.fits for d in two.placement)
    assert plan_offload(LlamaCppSettings(fit="off"), SIZES, kv, [CPU, small]).n_gpu_layers == 48
    assert plan_offload(LlamaCppSettings(n_gpu_layers=10), SIZES, kv, [CPU, small]).n_gpu_layers == 10
    assert plan_offload(LlamaCppSettings(n_gpu_layers=99), SIZES, kv, [CPU, GPU]).n_gpu_layers == 48
    assert plan_offload(LlamaCppSettings(n_gpu_layers=0), SIZES, kv, [CPU, GPU]).backend == "CPU"


def test_without_a_tensor_split_the_fit_fills_the_devices_back_to_front():
    gpus = Devices(["A", "B"], [2 * GIB, 1536 * MIB], [1.0, 1.0], [100 * MIB, 100 * MIB], GIB)
    # B (the last) takes the output layer (100 MiB) and 2 layers of 120 MiB in the 412 MiB its compute
    # buffer and margin leave; A 7 layers of 120 MiB in its 924 MiB
    assert fill_layers(SIZES, 20 * MIB, gpus) == [7, 3]
    offload = plan_offload(LlamaCppSettings(), SIZES, 47 * 20 * MIB,
                           [CPU, Device("CUDA0", "a", "GPU", "CUDA", "CUDA0", 2 * GIB, 4 * GIB),
                            Device("CUDA1", "b", "GPU", "CUDA", "CUDA1", 1536 * MIB, 4 * GIB)], [100 * MIB] * 2)
    assert offload.tensor_split == (7.0, 3.0) and [d.layers for d in offload.placement] == [7, 3]
    assert all(d.fits for d in offload.placement)
    params = llama_cpp.llama_model_default_params()
    apply(params, LlamaCppSettings(), offload)
    assert (params.n_gpu_layers, params.tensor_split[0], params.tensor_split[1]) == (10, 7.0, 3.0)


def test_fit_layers_is_the_most_that_fits_every_device():
    assert fit_layers(SIZES, 0, Devices(["A", "B"], [3 * GIB, 3 * GIB], [1.0, 1.0], [0, 0], 0)) == 48  # all
    gpus = Devices(["A", "B"], [GIB, GIB], [1.0, 1.0], [0, 0], 0)  # 10 layers of 100 MiB each
    n = fit_layers(SIZES, 0, gpus)
    assert n == 20 and [d.layers for d in place(n, SIZES, 0, gpus)] == [10, 10]
    assert not all(d.fits for d in place(n + 1, SIZES, 0, gpus))


# a mixture of experts: a dense first layer of 10 MiB, then 3 of 110 MiB whose experts are 100 MiB
# (the feed-forward part 105 MiB; all of it but the up projections 72, the down projections 38)
MOE = LayerBytes((10 * MIB,) + (110 * MIB,) * 3, 10 * MIB, 0,
                 ({},) + ({"moe": 100 * MIB, "attn": 105 * MIB, "up": 72 * MIB, "gate": 38 * MIB},) * 3)


def one_gpu(mib: int) -> Devices:
    return Devices(["A"], [mib * MIB], [1.0], [0], 0)


def test_a_mixture_of_experts_keeps_experts_in_host_memory_before_whole_layers():
    """common/fit.cpp: every layer offloaded with its experts in host memory (but the lowest, as
    llama.cpp counts it), then layers made whole front to back while they fit, then part of the
    next one with the largest fraction that fits."""
    # 260 MiB: layers 0-2 whole (230 MiB), layer 3 keeps its whole feed-forward part in host memory
    # (5 MiB on the device; with only its down projections or all but its up projections there it
    # would not fit), the output layer (10 MiB)
    slots = fill_experts(MOE, 0, one_gpu(260))
    assert slots == [Slot(5, 2, "attn")] and held(slots, MOE, 0, one_gpu(260))[0].used == 245 * MIB
    assert partial_overrides(slots, 4, ["CPU"]) == [(r"blk\.3\.ffn_(gate|up|gate_up|down).*", "CPU"),
                                                    (r"blk\.4\.ffn_(up|down|gate_up|gate)_(ch|)exps", "CPU")]
    assert fill_experts(MOE, 0, one_gpu(300)) == [Slot(5, 2, "up")]  # 278 MiB: its up projections fit
    assert fill_experts(MOE, 0, one_gpu(320)) == [Slot(5, 2, "gate")]  # 312 MiB: all but its down projections
    # dense-only layers, back to front: all 5 in 50 MiB (the lowest, layer 0, is dense; nothing to
    # spare); in 40 MiB the output layer alone, since llama.cpp counts the lowest of them whole (with
    # 2 layers, layer 3 and its experts)
    assert fill_experts(MOE, 0, one_gpu(50)) == [Slot(5, 4)]
    assert fill_experts(MOE, 0, one_gpu(40)) == [Slot(1, 0)]
    # two devices: A (150 MiB) takes layers 0 and 1 whole and layer 2 but its feed-forward part, which
    # goes to B (the next device) with layer 3 and the output layer
    two = Devices(["A", "B"], [150 * MIB, 400 * MIB], [1.0, 1.0], [0, 0], 0)
    slots = fill_experts(MOE, 0, two)
    assert slots == [Slot(3, 1, "attn", spill=True), Slot(2, 0)] and all(p.fits for p in held(slots, MOE, 0, two))
    assert [p.used // MIB for p in held(slots, MOE, 0, two)] == [125, 225]
    assert partial_overrides(slots, 4, ["A", "B"]) == [(r"blk\.2\.ffn_(gate|up|gate_up|down).*", "B")]


def test_plan_offload_moves_experts_unless_the_user_placed_tensors():
    small = Device("CUDA1", "a small GPU", "GPU", "CUDA", "CUDA1", 1284 * MIB, 4 * GIB)  # 260 MiB past the margin
    offload = plan_offload(LlamaCppSettings(), MOE, 0, [CPU, small], [0])
    assert offload.n_gpu_layers == 5 and offload.placement[0].partial == 2 and len(offload.moved) == 2
    assert "5 layers (2 with experts in host memory)" in offload.describe()
    params = llama_cpp.llama_model_default_params()
    _keep = apply(params, LlamaCppSettings(), offload)
    entries = ctypes.cast(params.tensor_buft_overrides, ctypes.POINTER(_TensorOverride))
    assert [entries[i].pattern.decode() for i in range(2)] == [p for p, _ in offload.moved] and not entries[2].pattern
    # --cpu-moe (the user's placement): whole layers, the experts where the user put them
    assert plan_offload(LlamaCppSettings(cpu_moe=True), MOE, 0, [CPU, small], [0]).moved == ()


def test_the_draft_model_is_on_the_gpus_where_the_model_wholly_is():
    draft = {"speculative": "draft", "draft_model": "d.gguf"}
    whole, part = Offload("CUDA", (), 48, 47, ()), Offload("CUDA", (), 30, 47, ())
    assert draft_gpu_layers(LlamaCppSettings(**draft), whole) >= 48
    assert draft_gpu_layers(LlamaCppSettings(**draft), part) == 0
    assert draft_gpu_layers(LlamaCppSettings(**draft, n_gpu_layers_draft=5), part) == 5
    assert draft_gpu_layers(LlamaCppSettings(**draft, n_gpu_layers_draft="all"), Offload("CPU", (), 0, 47, ())) >= 48


def test_choices_that_do_not_fit_the_machine_are_refused():
    with pytest.raises(EngineError, match="--main-gpu 1: this machine has 1 GPU"):
        plan_offload(LlamaCppSettings(main_gpu=1), SIZES, 1, [CPU, GPU])
    with pytest.raises(EngineError, match="--tensor-split gives 2 parts for 1 GPU"):
        plan_offload(LlamaCppSettings(tensor_split="3,1"), SIZES, 1, [CPU, GPU])
    with pytest.raises(EngineError, match="--batch-invariant is measured on llama.cpp's CPU backend only; with 48 "
                                          "layers on CUDA"):
        plan_offload(LlamaCppSettings(batch_invariant=True), SIZES, 1, [CPU, GPU], [0])
    assert plan_offload(LlamaCppSettings(batch_invariant=True, n_gpu_layers=0), SIZES, 1, [CPU, GPU]).n_gpu_layers == 0


def test_a_split_gguf_is_counted_whole(tmp_path):
    for i, size in enumerate((300, 200, 100), 1):
        (tmp_path / f"m-Q8_0-{i:05d}-of-00003.gguf").write_bytes(b"x" * size)
    first = tmp_path / "m-Q8_0-00001-of-00003.gguf"
    assert [p.name for p in gguf_shards(first)] == [f"m-Q8_0-{i:05d}-of-00003.gguf" for i in (1, 2, 3)]
    assert gguf_bytes(first) == 600
    (tmp_path / "one.gguf").write_bytes(b"x" * 7)
    assert gguf_shards(tmp_path / "one.gguf") == [tmp_path / "one.gguf"] and gguf_bytes(tmp_path / "one.gguf") == 7


def test_libggml_is_the_one_libllama_uses_else_found_under_the_platforms_name(tmp_path, monkeypatch):
    """ggml's functions come through libllama (the wheel's libggml.so is a second copy with a
    registry of its own); where the linker does not look in a library's dependencies (Windows),
    libggml is opened from llama-cpp-python's folder by the platform's name: on macOS
    libggml.dylib (a folder holding the libraries under macOS's names, LLAMA_CPP_LIB_PATH's role)."""
    from llama_cpp import llama_cpp as bindings

    ggml.cache_clear()
    try:
        assert ggml()._handle == bindings._lib._handle
        for lib in bindings._base_path.iterdir():
            if lib.name.startswith("lib") and ".so" in lib.name:
                shutil.copy(lib, tmp_path / lib.name)
        (tmp_path / "libggml.so").rename(tmp_path / "libggml.dylib")
        monkeypatch.setattr(bindings, "_lib", ctypes.CDLL(ctypes.util.find_library("m")))  # no ggml in it
        monkeypatch.setattr(bindings, "_base_path", tmp_path)
        monkeypatch.setattr(sys, "platform", "darwin")
        ggml.cache_clear()
        lib = ggml()
        assert lib._name == str(tmp_path / "libggml.dylib")
        assert lib.ggml_backend_dev_count() >= 1
        empty = tmp_path / "empty"
        empty.mkdir()
        monkeypatch.setattr(bindings, "_base_path", empty)
        ggml.cache_clear()
        with pytest.raises(EngineError, match=f"cannot load llama.cpp's ggml library from {empty}"):
            ggml()
    finally:
        ggml.cache_clear()


def test_rpc_needs_a_server_that_answers():
    with pytest.raises(EngineError, match="--rpc 127.0.0.1:1: no llama.cpp rpc-server answers there"):
        add_rpc_servers(["127.0.0.1:1"])
    assert devices_module._rpc_servers == []


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
    every = plan_offload(LlamaCppSettings(cpu_moe=True), SIZES, 1)
    assert every.overrides == ((r"\.ffn_(up|down|gate|gate_up)_(ch|)exps", "CPU"),)
    first = plan_offload(LlamaCppSettings(n_cpu_moe=100), LayerBytes((1, 1, 1), 1, 1), 1)  # at most every layer
    assert [p for p, _ in first.overrides] == [rf"blk\.{i}{EXPERTS}" for i in range(3)]


def test_an_unknown_buffer_type_names_the_ones_there_are():
    params = llama_cpp.llama_model_default_params()
    offload = plan_offload(LlamaCppSettings(override_tensor=["exps=CUDA0"]), SIZES, 1)
    with pytest.raises(EngineError, match=r"no buffer type 'CUDA0' in this build of llama.cpp \(it has: CPU\)"):
        apply(params, LlamaCppSettings(), offload)


@pytest.mark.parametrize("flags, message", [
    ({"n_gpu_layers": "most"}, "'most': expected a number of layers, auto or all"),
    ({"n_gpu_layers": -1}, "-1: expected 0 or more layers, auto or all"),
    ({"tensor_split": "3,x"}, "expected shares such as 3,1"),
    ({"override_tensor": ["exps"]}, "expected PATTERN=BUFFER"),
    ({"override_tensor": ["(exps=CPU"]}, "is not a regular expression"),
    ({"cpu_moe": True, "n_cpu_moe": 4}, "give it or --n-cpu-moe, not both"),
    ({"rpc": "10.0.0.2"}, "'10.0.0.2': expected HOST:PORT"),
    ({"rpc": "10.0.0.2:50052,host:x"}, "'host:x': expected HOST:PORT"),
    ({"fit": "maybe"}, "Input should be 'on' or 'off'"),
    ({"n_gpu_layers_draft": 2}, "--n-gpu-layers-draft is for --speculative draft"),
])
def test_bad_values_are_one_line_errors(flags, message):
    with pytest.raises(ValidationError, match=message):
        LlamaCppSettings(**flags)
