"""Resolve ``--model`` to something loadable (``resolve``); a model named by its Hugging Face Hub
repository is fetched into the Hugging Face cache first (``hub``)."""

from glmserve.models.resolve import (
    DEFAULT_MODEL_NAME,
    ModelNotFoundError,
    ResolvedModel,
    default_model_path,
    gguf_bytes,
    gguf_shards,
    resolve_hf_model,
    resolve_model,
)

__all__ = ["DEFAULT_MODEL_NAME", "ModelNotFoundError", "ResolvedModel", "default_model_path", "gguf_bytes", "gguf_shards",
           "resolve_hf_model", "resolve_model"]
