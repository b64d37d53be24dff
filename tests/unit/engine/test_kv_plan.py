"""The KV cache a llama_cpp model starts with (``memory.plan_kv``, ``params.with_kv_plan``): the
layout and context that fit the machine, the bytes a cell takes at each cache type, and the
refusals a user gets when what they asked for cannot fit."""

from __future__ import annotations

import pytest

from glmserve.engine.base import EngineError
from glmserve.engine.llama_cpp.loading.memory import KVShape, kv_shape, plan_kv
from glmserve.engine.llama_cpp.params import in_force, with_kv_plan
from glmserve.engine.llama_cpp.settings import LlamaCppSettings

GIB = 2**30
# GLM-4.7-Flash as llama.cpp caches it: 47 layers, one 576-wide latent K per layer, no V
FLASH = {"general.architecture": "deepseek2", "deepseek2.attention.key_length": "576",
         "deepseek2.attention.value_length": "512", "deepseek2.attention.kv_lora_rank": "512"}
FLASH_CELL = 47 * 576 * 2  # f16 bytes
FLASH_WEIGHTS = 18 * GIB  # GLM-4.7-Flash at Q4_K_M


def settings(**kw) -> LlamaCppSettings:
    return in_force(LlamaCppSettings(**kw))


def test_mla_caches_k_alone_and_other_models_k_and_v():
    assert kv_shape(FLASH, 47, 20, 1, 2048) == KVShape(47 * 576, 0)
    llama = {"general.architecture": "llama"}  # SmolLM2: 30 layers, 3 KV heads of 64
    assert kv_shape(llama, 30, 9, 3, 576) == KVShape(30 * 3 * 64, 30 * 3 * 64)


@pytest.mark.parametrize("k, v, per_cell", [("f16", "f16", 47 * 576 * 2), ("q8_0", "q8_0", 47 * 576 // 32 * 34),
                                            ("q4_0", "f16", 47 * 576 // 32 * 18), ("f32", "f16", 47 * 576 * 4)])
def test_bytes_per_cell_follow_the_cache_types(k, v, per_cell):
    assert KVShape(47 * 576, 0).bytes_per_cell(k, v) == per_cell
    assert KVShape(100, 100).bytes_per_cell("q8_0", "q4_0") == -(-100 * 34 // 32) + -(-100 * 18 // 32)


def test_a_small_context_stays_split():
    plan = plan_kv(settings(n_ctx=4096, max_num_seqs=8), 8192, 23040, 100 << 20, total=24 * GIB)
    assert (plan.kv_layout, plan.n_ctx, plan.cells, plan.choice) == ("split", 4096, 8 * 4096, None)


@pytest.mark.parametrize("n_ctx", [32768, 65536])
def test_a_long_context_that_split_would_not_fit_is_unified_like_llama_server(n_ctx):
    """The README's --n-ctx 65536 and launch's 32768 on a 24 GiB machine: split would take 8 x n_ctx
    cells (13.2 / 26.4 GiB); unified takes n_ctx cells, what llama-server's -c allocates."""
    plan = plan_kv(settings(n_ctx=n_ctx, max_num_seqs=8), 202752, FLASH_CELL, 12 << 20, total=24 * GIB)
    assert (plan.kv_layout, plan.n_ctx, plan.cells, plan.bytes) == ("unified", n_ctx, n_ctx, n_ctx * FLASH_CELL)
    assert f"unified, {n_ctx} cells shared by the 8 sequences" in plan.choice


def test_with_gpus_the_layout_follows_the_gpus_memory():
    """GLM-4.7-Flash Q4_K_M at 64k on a 128 GB host with a 24 GB GPU: split (8 x 65,536 cells,
    26.4 GiB) would not fit the GPU beside the weights, so unified, as llama-server's -c 65536;
    a 105 GiB model on a 141 GB GPU with 128 GB of host memory is not refused."""
    flash = settings(n_ctx=65536, max_num_seqs=8)
    assert plan_kv(flash, 202752, FLASH_CELL, FLASH_WEIGHTS, total=128 * GIB).kv_layout == "split"  # host alone
    on_gpu = plan_kv(flash, 202752, FLASH_CELL, FLASH_WEIGHTS, total=128 * GIB, gpu=24 * GIB)
    assert (on_gpu.kv_layout, on_gpu.cells) == ("unified", 65536)
    assert "the weights leave on the GPUs" in on_gpu.choice
    air = plan_kv(settings(n_ctx=32768, max_num_seqs=4), 131072, 46 * 8 * 128 * 2 * 2, 105 * GIB, total=128 * GIB,
                  gpu=141 * GIB)
    assert air.n_ctx == 32768
    with pytest.raises(EngineError, match="would not fit in this machine's memory"):
        plan_kv(settings(n_ctx=32768, max_num_seqs=4), 131072, 46 * 8 * 128 * 2 * 2, 105 * GIB, total=128 * GIB)


def test_split_and_unified_when_asked_are_kept():
    asked = settings(n_ctx=32768, max_num_seqs=8, kv_layout="split")
    plan = plan_kv(asked, 202752, FLASH_CELL, 12 << 20, total=24 * GIB)
    assert (plan.kv_layout, plan.cells, plan.choice) == ("split", 8 * 32768, None)
    unified = plan_kv(settings(n_ctx=1024, kv_layout="unified"), 8192, 100, 0, total=24 * GIB)
    assert (unified.kv_layout, unified.cells) == ("unified", 1024)


def test_the_training_context_is_capped_to_what_fits():
    """--n-ctx 0: GLM-4.7-Flash's 202,752 tokens (10.2 GiB unified) fit a 48 GiB machine beside its
    18 GiB of weights, not a 32 GiB one, where the context is cut to what the weights leave of 3/4."""
    roomy = plan_kv(settings(n_ctx=0), 202752, FLASH_CELL, FLASH_WEIGHTS, total=48 * GIB)
    assert (roomy.kv_layout, roomy.n_ctx) == ("unified", 202752)
    tight = plan_kv(settings(n_ctx=0), 202752, FLASH_CELL, FLASH_WEIGHTS, total=32 * GIB)
    limit = 32 * GIB * 3 // 4 - FLASH_WEIGHTS
    assert tight.kv_layout == "unified" and tight.n_ctx % 256 == 0
    assert tight.bytes <= limit < tight.bytes + 256 * FLASH_CELL
    assert "the training context (202752 tokens) would not fit: n_ctx" in tight.choice


def test_a_context_given_that_cannot_fit_is_refused_with_what_to_change():
    with pytest.raises(EngineError, match=r"unified: 262144 cells, 13\.2 GiB\) would not fit in this machine's memory "
                                          r"\(24\.0 GiB, 18\.0 GiB of weights\); lower --n-ctx"):
        plan_kv(settings(n_ctx=262144), 202752, FLASH_CELL, FLASH_WEIGHTS, total=24 * GIB)
    with pytest.raises(EngineError, match="or use --kv-layout unified"):
        plan_kv(settings(n_ctx=65536, kv_layout="split"), 202752, FLASH_CELL, 0, total=24 * GIB)


def test_a_smaller_cache_type_lets_a_context_fit():
    big = dict(n_ctx=131072, max_num_seqs=1)
    with pytest.raises(EngineError):  # f16: 6.6 GiB, where the weights leave 6 GiB
        plan_kv(settings(**big), 202752, FLASH_CELL, FLASH_WEIGHTS, total=32 * GIB)
    q8 = KVShape(47 * 576, 0).bytes_per_cell("q8_0", "q8_0")  # 3.5 GiB
    assert plan_kv(settings(**big, cache_type_k="q8_0"), 202752, q8, FLASH_WEIGHTS, total=32 * GIB).n_ctx == 131072


def test_the_host_prompt_cache_follows_the_layout_chosen():
    long = plan_kv(settings(n_ctx=65536, max_num_seqs=8), 202752, FLASH_CELL, 0, total=24 * GIB)
    assert with_kv_plan(settings(n_ctx=65536, max_num_seqs=8), long).cache_ram == 0  # unified: off
    short = plan_kv(settings(n_ctx=4096), 202752, FLASH_CELL, 0, total=24 * GIB)
    assert with_kv_plan(settings(n_ctx=4096), short).cache_ram == 2048  # split: the default
    with pytest.raises(EngineError, match="unified, 65536 cells shared.*--cache-ram needs --kv-layout split"):
        with_kv_plan(settings(n_ctx=65536, max_num_seqs=8, cache_ram=1024), long)
