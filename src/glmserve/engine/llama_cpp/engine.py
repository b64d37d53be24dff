"""The ``llama_cpp`` engine: GGUF models on the CPU and GPUs (``loading/``), continuously batched.

One llama.cpp context for ``max_num_seqs`` sequences. Its KV cache (``--kv-layout``, ``loading/memory.plan_kv``) is
split (one stream of ``n_ctx`` cells per sequence) or unified (``n_ctx`` cells shared, llama-server's). A worker thread
runs engine steps (nano-vllm's shape): ``Scheduler.schedule()``, then one ``llama_decode`` of a batch holding the
next token of every running sequence plus prompt chunks of new ones, then sampling with each sequence's own
llama.cpp sampler chain and post-processing (detokenize, end-of-turn/length checks, hand-off to the event loop).
Requests join and leave between steps; an abort takes effect at the next step.

GGUF LoRA adapters (``lora.py``): each step serves one adapter group (the scheduler takes turns among them).
``--runner pooling`` (or a non-causal GGUF): embeddings only (``embedding.py``). Prompt chunks fill each step up to
``max_num_batched_tokens`` (512 by default, llama.cpp's micro-batch, so long prompts prefill at llama.cpp's pace; 63
with ``--batch-invariant``, below llama.cpp's 64-token threshold, so outputs do not depend on what a request is
batched with). With ``--cache-ram`` (split layout), a free sequence's state is saved in host memory before its cells
are reclaimed and restored for a later prompt that shares a longer prefix with it
(``engine/llama_cpp/kv/prompt_cache.py``).

Speculative decoding (``speculative/``: ``ngram``, its ``__init__``; ``draft``, ``draft_model.py``; ``mtp``,
``mtp.py``): in a step that decodes one sequence alone, it may append a draft to its one token, within
``max_num_batched_tokens``; its rows are sampled in order until a sampled token differs from the draft, and the
rejected draft tokens' KV cells are dropped. Those steps are timed (``draft_cost.StepCosts``), so that an n-gram
draft is sent only when it pays; finished sequences feed the n-gram pool of earlier generations (``ngram_pool.py``).
Images (``--mmproj``, ``vision.py``): a prompt's images are decoded whole, apart from the batch (``kv/batch.py``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from dataclasses import dataclass

import llama_cpp
from llama_cpp._internals import LlamaModel
from llama_cpp._utils import suppress_stdout_stderr

from glmserve.engine.base import EngineError
from glmserve.engine.llama_cpp.kv.batch import BatchDecoder
from glmserve.engine.llama_cpp.speculative.draft_cost import StepCosts
from glmserve.engine.llama_cpp.speculative.draft_model import DraftModel, ModelDrafter
from glmserve.engine.llama_cpp.embedding import Embedder, embeddings_only
from glmserve.engine.llama_cpp.handles import free_handles
from glmserve.engine.llama_cpp.params import context_params, in_force, speculative_config, with_kv_plan
from glmserve.engine.llama_cpp.lora import GGUFAdapters
from glmserve.engine.llama_cpp.loading.metadata import model_params
from glmserve.engine.llama_cpp.loading.measure import Companion, draft_gpu_layers, offload_model
from glmserve.engine.llama_cpp.loading.memory import model_kv_shape, plan_kv
from glmserve.engine.llama_cpp.speculative.mtp import MtpDraft, require_nextn
from glmserve.engine.llama_cpp.speculative.ngram_pool import POOL_NGRAM, NgramPool
from glmserve.engine.llama_cpp.sampling import SamplerChain, token_logprob
from glmserve.engine.llama_cpp.speculative import NgramDrafter, plan_drafts
from glmserve.engine.llama_cpp.tokenizer import IncrementalDecoder, LlamaCppTokenizer
from glmserve.engine.llama_cpp.vision import Projector, load_projector
from glmserve.engine.llama_cpp.kv.prompt_cache import HostPromptCache
from glmserve.engine.rules import check_request, escaped_tags, finish_reason, stop_token_ids
from glmserve.engine.llama_cpp.kv.scheduler import Scheduler
from glmserve.engine.llama_cpp.settings import LlamaCppSettings
from glmserve.engine.llama_cpp.kv.sequence import Sequence, SeqStatus
from glmserve.engine.stream import OutputStream, RequestStream
from glmserve.engine.types import (EngineStats, FinishReason, GenerationOutput, GenerationRequest, ModelInfo,
                                   SpecDecodeCounters, TokenLogprob)
from glmserve.engine.worker import StepWorker
from glmserve.models import ResolvedModel, gguf_bytes

log = logging.getLogger("glmserve.engine.llama_cpp")


@dataclass(slots=True)
class _SeqState:
    request: GenerationRequest
    stream: OutputStream
    sampler: SamplerChain
    decoder: IncrementalDecoder
    stop_ids: frozenset[int]  # end generation with "stop" (empty with ignore_eos)
    drafter: NgramDrafter | ModelDrafter | None = None  # speculative decoding


class LlamaCppEngine(StepWorker[Sequence]):
    """See module docstring. The worker loop, aborts and failure policy: ``StepWorker``."""

    log = log

    def __init__(self, model: ResolvedModel, settings: LlamaCppSettings) -> None:
        """Raises ``EngineError`` (``in_force``), ``ModelNotFoundError`` (a ``--draft-model``)."""
        self._resolved = model
        self.settings = settings = in_force(settings)
        self.speculative = speculative_config(settings)
        self._model: LlamaModel | None = None
        self._ctx = None
        self._decoder: BatchDecoder | None = None
        self._embedder: Embedder | None = None
        self._draft: DraftModel | MtpDraft | None = None  # --speculative draft, mtp
        self._scheduler: Scheduler | None = None
        self._init_worker(settings.max_num_seqs, settings.max_queue, settings.stream_interval_ms)
        self._by_id: dict[str, Sequence] = {}
        self._adapters: GGUFAdapters | None = None  # at start()
        self.spec_decode = SpecDecodeCounters() if self.speculative else None
        self._step_costs = StepCosts(learn=settings.spec_ngram_cost == "measured")  # timed 1-sequence steps
        self._ngram_pool: NgramPool | None = None  # --speculative ngram, at start()
        self.host_cache: HostPromptCache | None = None  # --cache-ram, at start()
        self.tokenizer: LlamaCppTokenizer
        self.model_info: ModelInfo
        self.multimodal: Projector | None = None  # image input (--mmproj, vision.py)

    # ---- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        path, cfg, spec = self._resolved.path, self.settings, self.speculative
        # llama-cpp-python prints every llama.cpp log line (some once per token) while its logger is unset
        logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)
        mtp = spec is not None and spec.method == "mtp"
        # the overrides live until the model is loaded; NextN layers are loaded for MTP drafts
        params, _overrides = model_params(path, mtp)
        self.offload, plan, _kept = offload_model(params, cfg, path, Companion.of(cfg, spec, path))  # GPUs, KV plan
        try:
            self._model = LlamaModel(path_model=str(path), params=params, verbose=False)
        except (ValueError, RuntimeError, OSError) as exc:
            raise EngineError(f"cannot load {path}: {exc}{self.offload.failure()}") from exc
        self._adapters = GGUFAdapters(self._model.model)
        if self._start_pooling():
            return
        per_cell = model_kv_shape(self._model).bytes_per_cell(cfg.cache_type_k, cfg.cache_type_v)
        try:
            if mtp:
                require_nextn(self._model)
            for name, adapter_path in cfg.lora_adapters().items():
                self._adapters.load(name, adapter_path)
            plan = plan or plan_kv(cfg, self._model.n_ctx_train(), per_cell, gguf_bytes(path))
            self.settings = cfg = with_kv_plan(cfg, plan)
            self.multimodal = load_projector(self._model, cfg, path, mtp)
        except EngineError:  # LoRAAdapterError too
            self._model.close()  # frees the adapters loaded so far with it
            self._model = None
            self._adapters.forget()
            raise
        split = cfg.kv_layout == "split"
        params = context_params(cfg, plan.cells)
        with suppress_stdout_stderr(disable=False):
            self._ctx = llama_cpp.llama_init_from_model(self._model.model, params)
        if not self._ctx:
            self.shutdown()  # the model, a projector
            raise EngineError(f"cannot create a llama.cpp context for {path} ({cfg.kv_layout} KV cache of {plan.cells} "
                              f"cells, K {cfg.cache_type_k}, V {cfg.cache_type_v}, max_num_seqs={cfg.max_num_seqs})"
                              f"{self.offload.failure()}")
        self._adapters.ctx = self._ctx
        per_seq = llama_cpp.llama_n_ctx_seq(self._ctx)  # llama.cpp pads streams to 256 cells
        n_ctx = min(cfg.n_ctx, per_seq)
        cells = llama_cpp.llama_n_ctx(self._ctx)
        self.kv_cache_bytes = cells * per_cell
        log.info("%s: %s", path.name, self.offload.describe())
        log.info("KV cache (%s): %d cells, %d per sequence for %d sequences, %.1f MiB (K %s, V %s); "
                 "each request may use n_ctx=%d; host prompt cache %s%s", cfg.kv_layout, cells,
                 per_seq if split else cells, cfg.max_num_seqs, self.kv_cache_bytes / 2**20, cfg.cache_type_k,
                 cfg.cache_type_v, n_ctx, f"up to {cfg.cache_ram} MiB" if cfg.cache_ram else "off",
                 f" (auto: {plan.choice})" if plan.choice else "")
        self._decoder = BatchDecoder(self._ctx, cfg.max_num_batched_tokens, by_slot=split)
        self.host_cache = HostPromptCache(cfg.cache_ram * 2**20) if cfg.cache_ram else None
        self._scheduler = Scheduler(cfg.max_num_seqs, n_ctx, cfg.max_num_batched_tokens, cfg.kv_layout,
                                    self.host_cache)
        self.tokenizer = LlamaCppTokenizer(self._model)
        self._embedder = Embedder(self._model.model, self._model.metadata(), n_ctx, cfg.n_threads)
        self.model_info = ModelInfo(
            id=self._resolved.name,
            context_length=n_ctx,
            chat_template=self._model.metadata().get("tokenizer.chat_template"),
            bos_token=self.tokenizer.token_text(self.tokenizer.bos_id),
            eos_token=self.tokenizer.token_text(self.tokenizer.eos_id),
            grammar=True, lora_adapters=self._adapters.names, max_num_seqs=cfg.max_num_seqs,
            max_num_batched_tokens=cfg.max_num_batched_tokens, max_queue=self._admission.max_queue,
            embedding_size=self._embedder.size, vision=self.multimodal is not None, backend=self.offload.backend,
            n_gpu_layers=self.offload.n_gpu_layers, devices=self.offload.devices)
        if spec is not None and spec.method != "ngram":
            try:
                self._draft = (MtpDraft(self._model, self._ctx, context_params(cfg, params.n_ctx), spec.draft_max + 2)
                               if spec.method == "mtp" else
                               DraftModel(spec.draft_model, self._model, params.n_ctx, cfg.max_num_seqs, not split,
                                          cfg.n_threads, draft_gpu_layers(cfg, self.offload)))
            except EngineError:
                self.shutdown()
                raise
            self._decoder.follower = self._draft if spec.method == "mtp" else None
            log.info("speculative decoding: %s, greedy drafts of up to %d tokens within --max-num-batched-tokens %d",
                     spec.draft_model or "the model's NextN (MTP) layers", spec.draft_max, cfg.max_num_batched_tokens)
        elif spec is not None:
            self._ngram_pool = NgramPool()
            log.info("speculative decoding: ngram (prompt lookup, n-grams of %d to %d tokens, and %d-token n-grams of "
                     "earlier generations), drafts of up to %d tokens within --max-num-batched-tokens %d, sent when "
                     "they pay", spec.ngram_min, spec.ngram_max, POOL_NGRAM, spec.draft_max, cfg.max_num_batched_tokens)
        self._start_worker("llama-cpp-engine")

    async def load_lora_adapter(self, name: str, path: str) -> None:
        """See ``Engine.load_lora_adapter``: loaded on the worker thread, between steps."""
        def load() -> None:
            self._adapters.load(name, path)
            self.model_info = self.model_info.with_lora_adapters((*self.model_info.lora_adapters, name))

        await self._on_worker(load)

    async def unload_lora_adapter(self, name: str) -> None:
        """See ``Engine.unload_lora_adapter``: freed on the worker thread, between steps. Its idle
        prefix caches are dropped too (their KV holds the adapter's values)."""
        self.model_info = self.model_info.with_lora_adapters(
            tuple(a for a in self.model_info.lora_adapters if a != name))

        def free() -> None:
            self._end_where(lambda seq: seq.group == name, f"LoRA adapter {name!r} was unloaded")
            for slot in self._scheduler.drop_group(name):
                self._decoder.clear_slot(slot)
            self._adapters.free(name)

        await self._on_worker(free)

    def _start_pooling(self) -> bool:
        """Start for embeddings only (``--runner pooling``, or ``auto`` on a non-causal model):
        the embedding context alone, made at the first request, no generation context, KV cache
        or scheduler; False for a model to generate with. Raises ``EngineError`` (the model is
        closed) for a non-causal model to generate with, or a flag only generation uses."""
        cfg, model = self.settings, self._model
        try:
            if not embeddings_only(model.metadata(), cfg.runner, bool(cfg.lora), self.speculative is not None):
                return False
        except EngineError:
            self._model.close()
            self._model = None
            raise
        n_ctx = min(cfg.n_ctx or model.n_ctx_train(), model.n_ctx_train())
        self._embedder = Embedder(model.model, model.metadata(), n_ctx, cfg.n_threads)
        self.tokenizer = LlamaCppTokenizer(model)
        self.model_info = ModelInfo(
            id=self._resolved.name, context_length=n_ctx, chat_template=None, bos_token="", eos_token="",
            max_num_seqs=cfg.max_num_seqs, max_queue=self._admission.max_queue,
            embedding_size=self._embedder.size, generation=False)
        log.info("%s served for embeddings only (%s pooling, %s), inputs of up to %d tokens", self._resolved.name,
                 self._embedder.pooling, "causal" if self._embedder.causal else "non-causal", n_ctx)
        self._start_worker("llama-cpp-engine")
        return True

    def shutdown(self) -> None:
        """Abort what is still running, stop the worker, free llama.cpp resources."""
        self._stop_worker()
        if self.spec_decode is not None and self.spec_decode.num_drafts:
            log.info("speculative decoding: %s", self.spec_decode.describe())
        for part in ("_decoder", "_embedder", "_draft", "multimodal"):  # each once, if it was made
            if getattr(self, part) is not None:
                getattr(self, part).free()
                setattr(self, part, None)
        self._ngram_pool = None
        free_handles(ctx=self._ctx, model=self._model)
        self._ctx = self._model = None

    # ---- requests (any thread) ----------------------------------------------------------

    def generate(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop | None = None) -> RequestStream:
        if not self._worker_running:
            raise EngineError("engine is not running")
        if not self.model_info.generation:
            raise EngineError(f"model {self.model_info.id!r} is served for embeddings only (POST /v1/embeddings)")
        check_request(request, self.model_info)
        stop_ids = stop_token_ids(request.sampling, self.tokenizer.eog_ids)
        sampler = SamplerChain(request.sampling, self.tokenizer.vocab, self.tokenizer.n_vocab,
                               self.model_info.context_length, stop_ids)  # a bad grammar is a 400 even when full
        try:
            self._admission.acquire(request.tenant)
        except BaseException:
            sampler.free()
            raise
        stream = OutputStream(loop, merge=not request.token_by_token)
        spec, media = self.speculative, request.multimodal or ()  # images: vision.py's spans
        drafter = (None if spec is None or media else ModelDrafter(spec, self._draft) if self._draft is not None
                   else NgramDrafter(spec, self._step_costs, self._ngram_pool, request.cache_salt))
        state = _SeqState(request, stream, sampler, self.tokenizer.decoder(escaped_tags(request)), stop_ids, drafter)
        self._inbox.put(Sequence(request.request_id, list(request.prompt_token_ids), payload=state, group=request.lora,
                                 salt=request.cache_salt, tenant=request.tenant, priority=request.priority, media=media))
        return RequestStream(request.request_id, stream, self.abort)

    async def embed(self, token_ids: list[int]) -> list[float]:
        """See ``Engine.embed`` and ``engine/llama_cpp/embedding.py``."""
        embedder = self._embedder
        return await self._on_worker(lambda: embedder.embed(token_ids))

    # ---- worker thread (StepWorker hooks) -------------------------------------------------

    def stats(self) -> EngineStats:
        stats, counters, cache = super().stats(), self.spec_decode, self.host_cache
        return dataclasses.replace(stats, spec_decode=None if counters is None else counters.as_stats(),
                                   prompt_cache_ram=None if cache is None else cache.stats())

    def _kv_cache_usage(self) -> float | None:
        return self._scheduler.kv_used / self._scheduler.kv_capacity if self._scheduler is not None else None

    def _has_work(self) -> bool:
        return self._scheduler is not None and self._scheduler.has_work()

    def _held_s(self) -> float:
        return self._scheduler.held_s() if self._scheduler is not None else 0.0

    def _add(self, seq: Sequence) -> None:
        self._by_id[seq.request_id] = seq
        self._scheduler.add(seq)
        if seq.group is not None and seq.group not in self._adapters:  # unloaded since it was admitted
            self._finish(seq, "error", f"LoRA adapter {seq.group!r} was unloaded")

    def _lookup(self, request_id: str) -> Sequence | None:
        return self._by_id.get(request_id)

    def _num_generated(self, seq: Sequence) -> int:
        return seq.num_generated

    def _running(self) -> list[Sequence]:
        return self._scheduler.running if self._scheduler is not None else []

    def _unfinished(self) -> list[Sequence]:
        return [*self._running(), *(self._scheduler.waiting if self._scheduler is not None else ())]

    def _step(self) -> None:
        if self._scheduler is None:  # served for embeddings only: the worker runs embed calls alone
            return
        out = self._scheduler.schedule()
        for seq in out.preempted:
            log.info("request %s preempted (KV cache full); it will be recomputed", seq.request_id)
        if not out.chunks:
            return
        self._adapters.use(out.group)
        drafts = {}
        try:
            self._decoder.apply(out.kv_ops, self.host_cache)
            if self.spec_decode is not None:
                drafts = plan_drafts(out.chunks, out.num_tokens, self._scheduler, self.settings.max_num_batched_tokens)
            start = time.perf_counter()
            rows = self._decoder.decode(out.chunks, drafts)
        except RuntimeError as exc:
            for chunk in out.chunks:
                self._finish(chunk.seq, "error", str(exc))
            return
        for seq, row in rows:
            draft = drafts.get(seq)
            if draft:
                self._verify(seq, row, draft)
                continue
            token, logprob = self._sample(seq, row)
            self._scheduler.append_token(seq, token)
            self._emit(seq, token, logprob)
        if self.spec_decode is not None and out.num_tokens == 1:  # a step drafts could have been sent in
            self._step_costs.record(1 + sum(map(len, drafts.values())), time.perf_counter() - start)

    def _sample(self, seq: Sequence, row: int) -> tuple[int, TokenLogprob | None]:
        token = seq.payload.sampler.sample(self._ctx, row)
        k = seq.payload.request.sampling.logprobs
        return token, None if k is None else token_logprob(self._ctx, row, self.tokenizer.n_vocab, token, k)

    def _verify(self, seq: Sequence, row: int, draft: list[int]) -> None:
        """Sample rows ``row...`` (the sequence's last token, then its draft) until a sampled
        token differs from the draft or ends the request; keep the accepted draft tokens' KV
        cells, drop the others, emit every sampled token (``speculative/__init__.py`` for why this keeps
        the output distribution)."""
        stop_ids = seq.payload.stop_ids
        sampled: list[tuple[int, TokenLogprob | None]] = []
        for i in range(len(draft) + 1):
            token, logprob = self._sample(seq, row + i)
            sampled.append((token, logprob))
            if i == len(draft) or token != draft[i] or token in stop_ids:
                break
        accepted = len(sampled) - 1  # the draft tokens whose KV cells hold the right inputs
        self.spec_decode.add(len(draft), accepted + (sampled[-1][0] == draft[accepted] if accepted < len(draft)
                                                     else 0))
        seq.payload.drafter.record(len(draft), accepted)
        self._scheduler.accept_draft(seq, accepted)
        if accepted < len(draft):
            self._decoder.truncate(seq.slot, seq.position(seq.num_computed))
        for token, logprob in sampled:
            self._scheduler.append_token(seq, token)
            self._emit(seq, token, logprob)

    def _emit(self, seq: Sequence, token: int, logprob: TokenLogprob | None = None) -> None:
        state: _SeqState = seq.payload
        finish = finish_reason(token, state.stop_ids, seq.num_generated, len(seq.tokens),
                               state.request.sampling.max_tokens, self._scheduler.n_ctx)
        shown = state.request.shown_special_ids  # tags the parsers read, where the GGUF makes them control tokens
        text = "" if finish == "stop" else state.decoder.feed(self.tokenizer.piece(token, shown), token in shown)
        if finish is not None:
            text += state.decoder.flush()
        self._outputs.add(state.stream, GenerationOutput(seq.request_id, [token], text, finish, None,
                                                         seq.num_prompt, max(seq.num_cached, 0),
                                                         None if logprob is None else [logprob]))
        if finish is not None:
            self._finish(seq, finish, send=False)

    def _finish(self, seq: Sequence, reason: FinishReason, error: str | None = None, send: bool = True) -> None:
        if seq.status is SeqStatus.FINISHED:
            return
        cleared = self._scheduler.finish(seq, keep_cache=reason != "error")
        if cleared is not None:
            self._decoder.clear_slot(cleared)
        state: _SeqState = seq.payload
        state.sampler.free()
        if state.drafter is not None and reason != "error":
            state.drafter.finish(seq.tokens, seq.num_prompt)
        self._by_id.pop(seq.request_id, None)
        self._release(state.stream, seq.request_id, reason, error, seq.num_prompt, max(seq.num_cached, 0), send, seq.tenant)
