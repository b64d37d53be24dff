"""The ``vllm`` engine: vLLM's ``AsyncLLM`` (v1) under glmserve's ``Engine`` protocol.

vLLM schedules, batches (continuous batching, chunked prefill, prefix caching) and samples in
its own engine core process; glmserve's serving layer stays on top (chat templates, tool-call
parsers, stop strings, limits, errors), so every feature behaves as on the other engines.

- ``AsyncLLM`` is built in ``start`` with no event loop running; its output handler starts on
  the loop of the first request (the server's, or ``LLM``'s), and every request runs there:
  ``generate`` returns a ``VllmRequestStream`` (``engine/vllm/request.py``) whose reader
  iterates ``AsyncLLM.generate`` in its own task, as vLLM's server does: one loop, no task per
  request and no thread or queue hop per token (an engine thread with a loop of its own cost
  ~6 ms per token at concurrency 1 on this 2-core CPU, GIL hand-offs). A stream closed early
  aborts its request in vLLM (the sequence is freed at the next step); ``abort`` and
  ``shutdown`` abort through vLLM's output processor, so that a reader's stream ends.
  Requests from a second event loop are refused.
- Requests go in as rendered prompt token ids (``tokens_input``; with images a ``TokensPrompt``
  for vLLM's multimodal processor) with ``SamplingParams`` mapped field
  for field, outputs come back as deltas (``RequestOutputKind.DELTA``) of token ids; vLLM does
  not detokenize (``detokenize=False``): the shared ``HFTokenizer.detokenizer`` does, as for the
  transformers engine.
- Grammars (GBNF) go to vLLM's structured outputs with the xgrammar backend
  (``StructuredOutputsParams(grammar=...)``); vLLM's own xgrammar check runs at admission, so a
  grammar xgrammar rejects is a ``GrammarError`` (400), not a failed stream.
- Images: for a model vLLM serves as multimodal with image input (GLM-4V, GLM-4.1V, LLaVA,
  Idefics3...), ``multimodal`` is a ``VllmImages``: the prompt goes in as the chat template wrote
  it (one placeholder per image, not expanded) with the decoded images as vLLM's
  ``multi_modal_data``; vLLM's own multimodal processor expands the placeholders, and the prompt
  size vLLM reports (``RequestOutput.prompt_token_ids``) is the one usage counts. A prompt vLLM
  refuses (image tokens past the context, a placeholder count that does not match the images)
  ends the request as ``invalid`` (a 400). Fetching, decoding and limits stay the media policy's.
- LoRA adapters (PEFT folders) are checked against the model's weights before vLLM is imported
  (``peft_lora.check_adapter``), so an adapter that does not fit stops start-up; vLLM loads one at
  its first request (``LoRARequest``); requests for different adapters share a batch. With
  ``--lora`` at start, more adapters (up to that rank) load and unload at run time.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
from pathlib import Path

from vllm import SamplingParams as VllmSamplingParams
from vllm import __version__ as vllm_version
from vllm.lora.request import LoRARequest
from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams
from vllm.usage.usage_lib import UsageContext
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.structured_output.backend_xgrammar import validate_xgrammar_grammar

from glmserve.engine.base import EngineError, GrammarError, LoRAAdapterError, one_line
from glmserve.engine.hf_tokenizer import HFTokenizer
from glmserve.engine.peft_lora import check_adapter, lora_rank
from glmserve.engine.rules import check_request, stop_token_ids
from glmserve.engine.admission import AdmissionControl
from glmserve.engine.types import (
    EngineStats,
    GenerationRequest,
    ModelInfo,
    SamplingParams,
    SpecDecodeCounters,
)
from glmserve.engine.vllm.args import engine_args
from glmserve.engine.vllm.settings import VllmSettings
from glmserve.engine.vllm.request import VllmRequestStream
from glmserve.engine.vllm.spec_metrics import SpecDecodeLogger
from glmserve.models import ResolvedModel

log = logging.getLogger("glmserve.engine.vllm")

def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def _check_batch_invariant() -> None:
    """Raise ``EngineError`` unless this machine runs vLLM's batch-invariant mode: an NVIDIA GPU
    of compute capability 8.0 or higher (vLLM's docs, features/batch_invariance)."""
    from vllm.platforms import current_platform

    if not (current_platform.is_cuda() and current_platform.has_device_capability(80)):
        raise EngineError("--batch-invariant on vllm needs an NVIDIA GPU of compute capability 8.0 or higher "
                          f"(vLLM's batch-invariant mode); this machine's vLLM platform is "
                          f"{current_platform.device_name or current_platform.device_type}")


class VllmEngine:
    """See module docstring."""

    def __init__(self, model: ResolvedModel, settings: VllmSettings) -> None:
        self._resolved = model
        self.settings = settings
        self._admission: AdmissionControl  # at start(): vLLM decides max_num_seqs when it is not set
        self._loop: asyncio.AbstractEventLoop | None = None  # the consumers' loop, set by the first request
        self._llm: AsyncLLM | None = None
        self._live: set[str] = set()  # the ids of the requests admitted and not ended
        self._lora_requests: dict[str, LoRARequest] = {}
        self._lora_in_flight: collections.Counter[str] = collections.Counter()  # admitted requests per adapter
        self._lora_idle = threading.Condition()  # guards both; generate() may run on any thread
        self.spec_decode = SpecDecodeCounters() if settings.speculative is not None else None
        self.tokenizer: HFTokenizer
        self.model_info: ModelInfo
        self.multimodal: VllmImages | None = None  # set at start() for a model vLLM takes images for

    # ---- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        """Start vLLM (model load, KV cache). Raises ``EngineError``."""
        args = engine_args(self._resolved.path, self.settings)
        if self.settings.batch_invariant:
            _check_batch_invariant()
        try:
            # as vLLM's API server: its defaults (max_num_seqs, max_num_batched_tokens) are the server's
            self._llm = AsyncLLM.from_engine_args(
                args, usage_context=UsageContext.OPENAI_API_SERVER,
                stat_loggers=None if self.spec_decode is None else [SpecDecodeLogger.factory(self.spec_decode)])
        except Exception as exc:  # vLLM raises many kinds: config, memory, load errors
            raise EngineError(f"vLLM cannot serve {self._resolved.path}: {one_line(exc)}") from exc
        for i, (name, path) in enumerate(self.settings.lora_adapters().items(), start=1):
            self._lora_requests[name] = LoRARequest(name, i, str(path))
        if self._lora_requests and _on_cpu():
            log.warning("vLLM on CPU: a base-model request batched with LoRA adapter requests may be computed "
                        "with the adapter (a vLLM %s CPU defect, seen through vLLM's own server too); serve "
                        "adapters and the base model from separate servers where that matters", vllm_version)
        model_config, scheduler_config = self._llm.model_config, self._llm.vllm_config.scheduler_config
        self._admission = AdmissionControl(scheduler_config.max_num_seqs, self.settings.max_queue)
        hf = self._llm.get_tokenizer()
        eos = model_config.try_get_generation_config().get("eos_token_id")
        self.tokenizer = HFTokenizer(hf, tuple(eos) if isinstance(eos, (list, tuple)) else (eos,) if eos else ())
        self.multimodal = VllmImages(self.tokenizer) if _takes_images(model_config) else None
        self.model_info = ModelInfo(
            id=self._resolved.name,
            context_length=model_config.max_model_len,
            chat_template=getattr(hf, "chat_template", None),
            bos_token=self.tokenizer.token_text(self.tokenizer.bos_id),
            eos_token=self.tokenizer.token_text(self.tokenizer.eos_id),
            grammar=True,
            lora_adapters=tuple(self._lora_requests),
            max_num_seqs=scheduler_config.max_num_seqs,
            max_num_batched_tokens=scheduler_config.max_num_batched_tokens,
            max_queue=self._admission.max_queue,
            vision=self.multimodal is not None,
        )
        log.info("vLLM serves %s (%s), context %d tokens%s%s", self._resolved.path, model_config.dtype,
                 model_config.max_model_len, ", image input" if self.multimodal is not None else "",
                 f", adapters {', '.join(self._lora_requests)}" if self._lora_requests else "")
        if args.speculative_config is not None:
            log.info("speculative decoding: vLLM's %s", args.speculative_config)

    def shutdown(self) -> None:
        """Abort what is still running and stop vLLM's engine core."""
        if self.spec_decode is not None and self.spec_decode.num_drafts:
            log.info("speculative decoding: %s", self.spec_decode.describe())
        self._abort(list(self._live))  # their readers get finish_reason "abort", not a stream that never ends
        llm, self._llm = self._llm, None
        if llm is not None:
            llm.shutdown()

    # ---- requests (any thread) ----------------------------------------------------------

    def generate(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop | None = None) -> VllmRequestStream:
        if self._llm is None:
            raise EngineError("engine is not running")
        loop = loop or asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif loop is not self._loop:
            raise EngineError("the vllm engine serves one event loop; this request came from another")
        check_request(request, self.model_info)
        params = self._sampling_params(request.sampling)  # a bad grammar is a 400 even when full
        request_id, lora, tenant = request.request_id, request.lora, request.tenant
        self._admission.acquire(tenant)
        lora_request = None
        if lora is not None:
            with self._lora_idle:
                lora_request = self._lora_requests.get(lora)
                if lora_request is None or lora not in self.model_info.lora_adapters:
                    self._admission.release(tenant)  # never the base model under the adapter's name
                    raise LoRAAdapterError(f"LoRA adapter {lora!r} is not loaded")
                self._lora_in_flight[lora] += 1
        self._live.add(request_id)

        def release() -> None:  # once, when the request ends (VllmRequestStream)
            self._live.discard(request_id)
            self._admission.release(tenant)
            if lora is not None:
                with self._lora_idle:
                    self._lora_in_flight[lora] -= 1
                    self._lora_idle.notify_all()

        return VllmRequestStream(self._llm, self.tokenizer, request, params, lora_request, release)

    async def load_lora_adapter(self, name: str, path: str) -> None:
        """See ``Engine.load_lora_adapter``. vLLM sizes its LoRA slots and largest rank at start,
        so this needs a server started with ``--lora``; the adapter is checked against the
        model's weights (as at start) and loaded into vLLM (``add_lora``). Raises
        ``LoRAAdapterError``."""
        lora_config = self._llm.vllm_config.lora_config
        if lora_config is None:
            raise LoRAAdapterError("the vllm engine loads LoRA adapters at run time only when started with --lora "
                                   "(vLLM sizes its LoRA slots and largest rank at start)")
        folder = Path(path)
        await asyncio.to_thread(check_adapter, name, folder, self._resolved.path)
        rank = lora_rank(folder)
        if rank > lora_config.max_lora_rank:
            raise LoRAAdapterError(f"LoRA adapter {name!r} has rank {rank}; this server was started for rank "
                                   f"{lora_config.max_lora_rank} at most (the largest --lora adapter's)")
        request = LoRARequest(name, max((r.lora_int_id for r in self._lora_requests.values()), default=0) + 1,
                              str(folder))
        try:
            await self._llm.add_lora(request)
        except Exception as exc:  # vLLM's load errors vary by version
            raise LoRAAdapterError(f"vLLM cannot load LoRA adapter {name!r} ({path}): {one_line(exc)}") from exc
        with self._lora_idle:
            self._lora_requests[name] = request
            self.model_info = self.model_info.with_lora_adapters((*self.model_info.lora_adapters, name))

    async def unload_lora_adapter(self, name: str) -> None:
        """See ``Engine.unload_lora_adapter`` (vLLM's ``remove_lora`` once its requests ended:
        a condition the last one notifies, waited on off the event loop)."""
        with self._lora_idle:
            self.model_info = self.model_info.with_lora_adapters(
                tuple(a for a in self.model_info.lora_adapters if a != name))

        def wait_idle() -> LoRARequest | None:
            with self._lora_idle:
                self._lora_idle.wait_for(lambda: self._lora_in_flight[name] == 0)
                return self._lora_requests.pop(name, None)

        request = await asyncio.to_thread(wait_idle)
        if request is not None:
            await self._llm.remove_lora(request.lora_int_id)
            log.info("LoRA adapter %s unloaded", name)

    async def embed(self, token_ids: list[int]) -> list[float]:
        """Not on this engine: vLLM pools only with a model loaded for pooling (``--runner
        pooling``), not beside generation. Raises ``EngineError``."""
        raise EngineError("embeddings are not served by the vllm engine")

    def abort(self, request_id: str) -> None:
        """Abort ``request_id`` in vLLM (on the consumers' loop; from any thread): its stream ends
        with vLLM's ``finish_reason="abort"``."""
        self._abort([request_id])

    def _abort(self, request_ids: list[str]) -> None:
        llm, loop = self._llm, self._loop
        if llm is not None and loop is not None and request_ids and not loop.is_closed():
            # vLLM's output processor ends each stream at once; the engine core's abort may fail
            # after shutdown, quietly (nobody waits on this future)
            asyncio.run_coroutine_threadsafe(llm.abort(request_ids), loop)

    def stats(self) -> EngineStats:
        running, waiting = self._admission.split()
        spec = self.spec_decode
        return EngineStats(running, waiting, spec_decode=None if spec is None else spec.as_stats())

    def check_health(self) -> None:
        llm = self._llm
        if llm is None or llm.errored:
            raise EngineError("vLLM's engine core is not running")

    def _sampling_params(self, sp: SamplingParams) -> VllmSamplingParams:
        """glmserve's ``SamplingParams`` as vLLM's, field for field. Raises ``GrammarError`` for
        a grammar xgrammar does not accept."""
        params = VllmSamplingParams(
            max_tokens=sp.max_tokens, temperature=sp.temperature, top_p=sp.top_p, top_k=max(sp.top_k, 0),
            min_p=sp.min_p, presence_penalty=sp.presence_penalty, frequency_penalty=sp.frequency_penalty,
            repetition_penalty=sp.repetition_penalty, seed=sp.seed, ignore_eos=sp.ignore_eos,
            stop_token_ids=sorted(stop_token_ids(sp, self.tokenizer.eog_ids)),
            logit_bias=dict(sp.logit_bias) if sp.logit_bias else None,
            structured_outputs=StructuredOutputsParams(grammar=sp.grammar) if sp.grammar else None,
            logprobs=sp.logprobs, detokenize=False, output_kind=RequestOutputKind.DELTA,
        )
        if sp.grammar:
            try:
                validate_xgrammar_grammar(params)
            except ValueError as exc:
                raise GrammarError(f"the grammar does not compile: {one_line(exc)}") from exc
        return params

class VllmImages:
    """``process(text, images)`` -> ``(token_ids, multi_modal_data)``: the prompt's token ids with
    its image placeholders as the chat template wrote them, and ``{"image": images}`` (decoded
    PIL images, in prompt order) for vLLM, whose multimodal processor expands the placeholders."""

    def __init__(self, tokenizer: HFTokenizer) -> None:
        self._tokenizer = tokenizer

    def process(self, text: str, images: list) -> tuple[list[int], dict[str, list]]:
        return self._tokenizer.encode_prompt(text), {"image": list(images)}


def _takes_images(model_config) -> bool:
    """Whether vLLM serves the model as multimodal with image input (GLM-4V, LLaVA, Idefics3...)."""
    if not model_config.is_multimodal_model:
        return False
    try:
        return model_config.multimodal_config.get_limit_per_prompt("image") > 0
    except (AttributeError, KeyError, ValueError):  # vLLM versions differ here; multimodal means images
        return True
