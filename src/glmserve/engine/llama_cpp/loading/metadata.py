"""GGUF metadata corrected at load, where llama.cpp's converter leaves out a key that a GLM
architecture needs and llama.cpp's default for it is wrong (llama-server's ``--override-kv``, set
by glmserve).

GLM-4.7-Flash (``Glm4MoeLiteForCausalLM``) converts to llama.cpp's ``deepseek2`` architecture,
whose experts are routed with softmax unless the GGUF says ``expert_gating_func``; GLM-4.7-Flash
routes with sigmoid. The converter writes the key only when ``config.json`` names a
``scoring_func``, which GLM-4.7-Flash's does not, and llama.cpp recognises the stock model by its
shape (47 or 48 layers, 154880 tokens: ggml-org/llama.cpp#18980), so a fine-tune or any other
shape converted today decodes with the wrong experts. A ``deepseek2`` GGUF with GLM's
pre-tokenizer (``glm4``; DeepSeek's own models have theirs) is GLM-4.7-Flash, and without the key
it is loaded with sigmoid routing.
"""

from __future__ import annotations

import logging
from pathlib import Path

import llama_cpp
from llama_cpp._internals import LlamaModel

log = logging.getLogger("glmserve.engine.llama_cpp")

SIGMOID = 2  # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID (gguf-py's ExpertGatingFuncType.SIGMOID)


def overrides(metadata: dict[str, str]) -> dict[str, int]:
    """The metadata keys to override for a GGUF whose metadata (key -> value as text) is
    ``metadata``: ``{"deepseek2.expert_gating_func": SIGMOID}`` for a GLM-4.7-Flash GGUF without
    it (module docstring), else none."""
    if (metadata.get("general.architecture") == "deepseek2" and metadata.get("tokenizer.ggml.pre") == "glm4"
            and "deepseek2.expert_gating_func" not in metadata):
        return {"deepseek2.expert_gating_func": SIGMOID}
    return {}


def model_params(path: Path, load_mtp: bool = False) -> tuple[llama_cpp.llama_model_params, object]:
    """llama.cpp's model parameters for loading the GGUF at ``path``: the defaults, with the
    ``overrides`` its metadata needs (read from its header and vocabulary alone), and its NextN
    (MTP) layers loaded if ``load_mtp``. Returns the parameters and the override array they
    point into, which must stay alive until the model is loaded. A file that cannot be read gets
    the defaults (loading it then reports why)."""
    params = llama_cpp.llama_model_default_params()
    params.load_mtp = load_mtp
    header = llama_cpp.llama_model_default_params()
    header.vocab_only = True
    try:
        model = LlamaModel(path_model=str(path), params=header, verbose=False)
    except (ValueError, RuntimeError, OSError):
        return params, None
    try:
        fixes = overrides(model.metadata())
    finally:
        model.close()
    if not fixes:
        return params, None
    array = (llama_cpp.llama_model_kv_override * (len(fixes) + 1))()  # the last, empty, ends the list
    for entry, (key, value) in zip(array, fixes.items()):
        entry.key = key.encode()
        entry.tag = llama_cpp.LLAMA_KV_OVERRIDE_TYPE_INT
        entry.value.val_i64 = value
        log.info("%s: %s=%d (GLM-4.7-Flash routes its experts with sigmoid; the GGUF does not say so)",
                 path.name, key, value)
    params.kv_overrides = array
    return params, array
