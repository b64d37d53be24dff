"""``benchmarks/gpu_check.py``: its help documents it, the GLM-4-9B-shaped folder it writes
(for ``load_format=dummy``) is a model transformers and vLLM both take, with GLM-4-9B's size, and
a failed case's server log is kept in the report."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.benchmark_scripts import BENCHMARKS, load



def test_help_documents_both_parts():
    out = subprocess.run([sys.executable, str(BENCHMARKS / "gpu_check.py"), "--help"], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    for words in ("--model", "--perf-model", "glm-4-9b-dummy", "load_format=dummy", "tool_choice: required",
                  "json_schema", "LoRA", "Idefics3", "alternating", "CUDA graphs", "--concurrency"):
        assert words in out, words


def _gpu_check():
    return load("gpu_check")


def test_a_failed_cases_server_log_is_kept_in_the_report():
    log = "".join(f"line {i}\n" for i in range(200)) + "EngineDeadError: the cause\n"
    section = _gpu_check().log_section("glmserve on tiny", log)
    assert section[0] == "### glmserve on tiny (last 150 lines of its log)"
    assert section[3:-2] == [f"line {i}" for i in range(51, 200)] + ["EngineDeadError: the cause"]
    assert (section[2], section[-2]) == ("```", "```")


def test_dummy_glm_folder_has_glm_4_9b_shape(tmp_path):
    torch = pytest.importorskip("torch")
    from transformers import AutoConfig, AutoTokenizer, GlmForCausalLM

    from tests.unit.glm_tokenizer import glm_tokenizer

    glm_tokenizer("{{ messages[0]['content'] }}").save_pretrained(tmp_path / "tokenizer")  # GLM's special tokens

    folder = _gpu_check().write_dummy_glm(tmp_path / "tokenizer", tmp_path / "glm")
    config = AutoConfig.from_pretrained(folder)
    assert (config.model_type, config.hidden_size, config.num_hidden_layers, config.num_attention_heads,
            config.num_key_value_heads, config.intermediate_size) == ("glm", 4096, 40, 32, 2, 13696)
    assert config.vocab_size == len(AutoTokenizer.from_pretrained(folder))
    with torch.device("meta"):
        params = sum(p.numel() for p in GlmForCausalLM(config).parameters())
    # GLM-4-9B is 9,399,951,360 parameters with its 151,552-token vocabulary: the same less the embeddings' difference
    assert params == 9_399_951_360 - 2 * 4096 * (151_552 - config.vocab_size)
    pytest.importorskip("vllm")
    from vllm.engine.arg_utils import EngineArgs

    model_config = EngineArgs(model=str(folder), load_format="dummy", max_model_len=4096).create_model_config()
    assert model_config.architectures == ["GlmForCausalLM"]
    assert (model_config.get_hidden_size(), model_config.get_total_num_kv_heads(), model_config.get_head_size()) == (4096, 2, 128)


def test_the_checks_tiny_idefics3_has_the_patch_count_vllm_0_26_sizes_images_by(tmp_path):
    """The image crash on the H200 (vLLM 0.26, ``benchmarks/results/gpu_check_h200.md``): vLLM before
    0.32 cuts an Idefics3 request's ``pixel_values`` by the image processor's
    ``get_number_of_image_patches``, which is 0 for an image processor that does not split images,
    and its vision tower then failed on no pixels. The check's tiny Idefics3 splits images: the count
    vLLM 0.26 reads equals the patches the processor makes."""
    pytest.importorskip("torch")
    from PIL import Image
    from transformers import AutoProcessor

    from tests.hf_models import tiny_idefics3
    from tests.unit.glm_tokenizer import glm_tokenizer

    glm_tokenizer("{{ messages[0]['content'] }}").save_pretrained(tmp_path / "tokenizer")
    folder = tiny_idefics3(tmp_path / "tokenizer", tmp_path / "vlm", image_splitting=True)
    processor = AutoProcessor.from_pretrained(folder)
    image = Image.new("RGB", (32, 24), (255, 0, 0))  # gpu_check's image size
    made = processor(text="<image>", images=[image], return_tensors="pt")["pixel_values"].shape[1]
    counted, rows, cols = processor.image_processor.get_number_of_image_patches(24, 32, {})
    assert counted == made == rows * cols + 1 == 5  # 4 tiles of 28 px and the whole image
