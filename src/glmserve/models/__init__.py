"""Resolve ``--model`` to something loadable; never downloads."""

from glmserve.models.resolve import (
    DEFAULT_MODEL_NAME,
    ModelNotFoundError,
    ResolvedModel,
    default_model_path,
    resolve_hf_model,
    resolve_model,
)

__all__ = ["DEFAULT_MODEL_NAME", "ModelNotFoundError", "ResolvedModel", "default_model_path", "resolve_hf_model", "resolve_model"]
