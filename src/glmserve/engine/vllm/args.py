"""glmserve's settings -> vLLM's ``AsyncEngineArgs``.

Flags keep vLLM's names (``--tensor-parallel-size`` ...); ``--n-ctx`` is vLLM's
``max_model_len``; ``--speculative ngram`` with ``--spec-ngram-min/max`` and ``--spec-draft-max``
is vLLM's ``speculative_config`` ``{"method": "ngram", "prompt_lookup_min", "prompt_lookup_max",
"num_speculative_tokens"}``, ``--speculative draft --draft-model FOLDER`` its ``{"method":
"draft_model", "model", "num_speculative_tokens"}``; ``--engine-arg KEY=VALUE`` reaches any other ``AsyncEngineArgs`` field.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from glmserve.engine.base import EngineError
from glmserve.engine.peft_lora import LORA_RANKS, lora_rank
from glmserve.models import ModelNotFoundError, resolve_hf_model

if TYPE_CHECKING:
    from glmserve.engine.vllm.settings import VllmSettings
    from vllm.engine.arg_utils import AsyncEngineArgs


# tokens drafted by a model's MTP (NextN) layers unless --spec-draft-max says: vLLM's GLM-4.5/4.6/4.7
# recipes and its MTP guide draft 1 token (GLM has one NextN layer; each further token drafted from
# it is accepted less often)
MTP_DRAFT_DEFAULT = 1


def speculative_config(settings: VllmSettings) -> dict[str, Any] | None:
    """vLLM's ``speculative_config`` for ``--speculative``: ``ngram`` with ``prompt_lookup_min/max``,
    ``draft_model`` with the ``--draft-model`` folder, or ``mtp``; ``num_speculative_tokens`` from
    ``--spec-draft-max`` (for ``mtp`` unless given: ``MTP_DRAFT_DEFAULT``). Raises ``ModelNotFoundError`` for a draft model that is no model folder."""
    if settings.speculative is None:
        return None
    if settings.speculative == "draft":
        try:
            draft = resolve_hf_model(settings.draft_model).path
        except ModelNotFoundError as exc:
            raise ModelNotFoundError(f"--draft-model {exc}") from exc
        return {"method": "draft_model", "model": str(draft), "num_speculative_tokens": settings.spec_draft_max}
    if settings.speculative == "mtp":  # the model's own MTP layers (vLLM reads them from its checkpoint)
        drafted = settings.spec_draft_max if "spec_draft_max" in settings.model_fields_set else MTP_DRAFT_DEFAULT
        return {"method": "mtp", "num_speculative_tokens": drafted}
    return {"method": "ngram", "prompt_lookup_min": settings.spec_ngram_min,
            "prompt_lookup_max": settings.spec_ngram_max, "num_speculative_tokens": settings.spec_draft_max}


def parse_engine_args(items: list[str]) -> dict[str, Any]:
    """``["block_size=32", "kv_cache_dtype=fp8"]`` -> ``{"block_size": 32, "kv_cache_dtype": "fp8"}``:
    VALUE as JSON when it parses as JSON, else the string."""
    out: dict[str, Any] = {}
    for item in items:
        key, _, raw = item.partition("=")
        try:
            out[key] = json.loads(raw)
        except ValueError:
            out[key] = raw
    return out


def engine_args(model: Path, settings: VllmSettings) -> AsyncEngineArgs:
    """``AsyncEngineArgs`` for ``model`` served with ``settings``: prefix caching on, structured
    outputs by xgrammar, ``max_loras``/``max_lora_rank`` derived from the adapters (rank rounded
    up to one vLLM accepts); ``n_ctx``, ``max_num_seqs`` and ``max_num_batched_tokens`` vLLM's own
    defaults unless given. Raises ``EngineError`` for an unknown or conflicting ``--engine-arg``,
    ``ModelNotFoundError`` for a ``--draft-model`` that is no model folder."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    lora = settings.lora_adapters()
    speculative, extra = speculative_config(settings), parse_engine_args(settings.engine_arg)
    args: dict[str, Any] = {
        "model": str(model),
        "dtype": settings.dtype,
        "trust_remote_code": settings.trust_remote_code,
        "tensor_parallel_size": settings.tensor_parallel_size,
        "pipeline_parallel_size": settings.pipeline_parallel_size,
        "gpu_memory_utilization": settings.gpu_memory_utilization,
        "enforce_eager": settings.enforce_eager,
        "scheduling_policy": settings.scheduling_policy,
    }
    flag_backed = set(args)
    n_ctx = settings.n_ctx if "n_ctx" in settings.model_fields_set else None  # vLLM's default: the model's
    optional = {"max_model_len": n_ctx or None, "max_num_seqs": settings.max_num_seqs,
                "max_num_batched_tokens": settings.max_num_batched_tokens,
                "distributed_executor_backend": settings.distributed_executor_backend,
                "kv_cache_memory_bytes": settings.kv_cache_memory, "speculative_config": speculative}
    args.update({k: v for k, v in optional.items() if v is not None})
    if lora:  # each adapter was checked against the model's weights by build()
        ranks = [lora_rank(path) for path in lora.values()]
        rank = next((r for r in LORA_RANKS if r >= max(ranks)), None)
        if rank is None:
            raise EngineError(f"LoRA rank {max(ranks)} is above vLLM's largest ({LORA_RANKS[-1]})")
        args.update(enable_lora=True, max_loras=len(lora), max_lora_rank=rank)
    # defaults an --engine-arg may change
    args.update(enable_prefix_caching=True, structured_outputs_config={"backend": "xgrammar"},
                disable_log_stats=True)
    fields = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    for key in extra:
        if key not in fields:
            raise EngineError(f"--engine-arg {key}: not a vLLM engine argument (AsyncEngineArgs field)")
        if key == "speculative_config" and speculative is None:
            continue  # vLLM's other methods (a draft model, EAGLE ...) stay reachable
        if key in flag_backed or key in optional or key in ("enable_lora", "max_loras", "max_lora_rank"):
            raise EngineError(f"--engine-arg {key}: glmserve sets it; use its own flag")
    args.update(extra)
    try:
        return AsyncEngineArgs(**args)
    except (TypeError, ValueError) as exc:
        raise EngineError(f"invalid vLLM engine arguments: {exc}") from exc
