"""The ``transformers`` engine: Hugging Face models (CPU or GPU), batched, LoRA per request, images.

A worker thread runs engine steps over a scheduler of its own (transformers' continuous
batching manager is not used: it takes one generation config for all requests and no per-request
LoRA adapter; see the closing note of the issue and ``benchmarks/transformers_vs_llama_cpp.py``):

1. admit waiting requests while fewer than ``max_num_seqs`` run: each is prefilled alone
   (batch of one, images included) into a fresh ``DynamicCache``, its first token sampled, and
   its cache joins the running batch (``PaddedKVBatch``: left padding + attention mask);
2. decode: one forward of the running batch's last tokens, each row at its own position, then
   per-row sampling (``Sampler``) and post-processing; finished or aborted rows leave the batch.

LoRA: with adapters loaded the model is a ``PeftModel``; each forward passes PEFT's per-row
``adapter_names`` ("__base__" for the base model), so requests for different adapters share a
batch. Multimodal RoPE (GLM-4V, Qwen2-VL): the prefill lets the model compute its 3-D positions
and ``rope_deltas``; decode positions are then ``position + rope_delta`` per row.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import DynamicCache

from glmserve.engine import max_num_seqs_in_force
from glmserve.engine.admission import in_turn
from glmserve.engine.base import EngineError
from glmserve.engine.rules import check_request, escaped_tags, finish_reason, stop_token_ids
from glmserve.engine.stream import OutputStream, RequestStream
from glmserve.engine.transformers.batch import PaddedKVBatch
from glmserve.engine.transformers.grammar import GrammarCompiler
from glmserve.engine.peft_lora import check_adapter
from glmserve.engine.transformers.loader import LoadedCheckpoint, add_adapter, load_model, remove_adapter
from glmserve.engine.transformers.sampling import Sampler, token_logprob
from glmserve.engine.transformers.settings import TransformersSettings
from glmserve.engine.hf_tokenizer import HFTokenizer, IncrementalDetokenizer
from glmserve.engine.transformers.vision import ImageProcessor
from glmserve.engine.types import FinishReason, GenerationOutput, GenerationRequest, ModelInfo, TokenLogprob
from glmserve.engine.worker import StepWorker
from glmserve.models import ResolvedModel

log = logging.getLogger("glmserve.engine.transformers")

BASE_ADAPTER = "__base__"  # PEFT's name for "no adapter" in per-row adapter_names


@dataclass(slots=True, eq=False)
class _Seq:
    request: GenerationRequest
    stream: OutputStream
    sampler: Sampler
    detok: IncrementalDetokenizer
    stop_ids: frozenset[int]
    adapter: str
    num_prompt: int
    position: int = 0  # the next token's position (= tokens in the cache)
    rope_delta: int = 0
    last_token: int = -1
    num_generated: int = 0
    done: bool = False


class TransformersEngine(StepWorker[_Seq]):
    """See module docstring. The worker loop, aborts and failure policy: ``StepWorker``."""

    log = log

    def __init__(self, model: ResolvedModel, settings: TransformersSettings, loaded: LoadedCheckpoint | None = None) -> None:
        """``loaded``: a model already in memory (``start`` then loads nothing; the load
        settings, ``dtype``, ``device``, ``trust_remote_code`` and ``lora``, are not used)."""
        self._resolved = model
        self.settings = settings = settings.model_copy(update={"max_num_seqs": max_num_seqs_in_force(settings)})
        self._loaded = loaded
        self._init_worker(settings.max_num_seqs, settings.max_queue, settings.stream_interval_ms)
        self._waiting: deque[_Seq] = deque()
        self._batch_seqs: list[_Seq] = []  # row i of the batch is _batch_seqs[i]
        self._by_id: dict[str, _Seq] = {}
        self._batch = PaddedKVBatch()
        self.tokenizer: HFTokenizer
        self.model_info: ModelInfo
        self.multimodal: ImageProcessor | None = None

    # ---- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        """Load the model and start the worker. Both happen on the worker thread: PyTorch's CPU
        kernels run on an OpenMP thread team per calling thread, and when a second thread's team
        exists (the loader's), libgomp stops its workers from spin-waiting between parallel
        regions because its threads then outnumber the CPUs: measured here, a bfloat16 decode
        step took 62 ms instead of 31 ms. Raises ``EngineError``."""
        self._start_worker("transformers-engine", setup=self._load)

    def _load(self) -> None:
        cfg = self.settings
        torch.set_num_threads(cfg.n_threads)  # OpenMP's thread count is per thread
        if self._loaded is None:
            self._loaded = load_model(self._resolved, cfg.dtype, cfg.device, cfg.trust_remote_code,
                                      cfg.lora_adapters())
        loaded = self._loaded
        self.tokenizer = HFTokenizer(loaded.tokenizer, loaded.eos_ids)
        self._n_vocab = loaded.model.get_output_embeddings().weight.shape[0]  # logits width
        self._grammars = GrammarCompiler(loaded.tokenizer, self._n_vocab)
        if loaded.processor is not None:
            self.multimodal = ImageProcessor(loaded.processor, self._model_dtype())
        context = min(cfg.n_ctx, loaded.context_length) if cfg.n_ctx else loaded.context_length
        self.model_info = ModelInfo(
            id=self._resolved.name,
            context_length=context,
            chat_template=loaded.chat_template,
            bos_token=self.tokenizer.token_text(self.tokenizer.bos_id),
            eos_token=self.tokenizer.token_text(self.tokenizer.eos_id),
            vision=loaded.processor is not None,
            lora_adapters=loaded.adapters,
            grammar=True,
            max_num_seqs=self.settings.max_num_seqs,
            max_queue=self._admission.max_queue,
            embedding_size=loaded.model.get_input_embeddings().weight.shape[1],
        )
        log.info("loaded %s on %s (%s), context %d tokens%s", self._resolved.path, loaded.device,
                 self._model_dtype(), context, f", adapters {', '.join(loaded.adapters)}" if loaded.adapters else "")

    def _model_dtype(self) -> torch.dtype:
        return next(self._loaded.model.parameters()).dtype

    def shutdown(self) -> None:
        self._stop_worker()
        self._loaded = None
        self._batch = PaddedKVBatch()

    # ---- requests (any thread) ----------------------------------------------------------

    def generate(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop | None = None) -> RequestStream:
        if not self._worker_running:
            raise EngineError("engine is not running")
        check_request(request, self.model_info)
        sp = request.sampling
        stop_ids = stop_token_ids(sp, self.tokenizer.eog_ids)
        # a bad grammar is a 400 even when the engine is full; with ignore_eos the grammar may
        # still end on the model's own end-of-generation tokens
        mask = self._grammars.mask(sp.grammar, stop_ids or self.tokenizer.eog_ids) if sp.grammar else None
        self._admission.acquire(request.tenant)
        stream = OutputStream(loop, merge=not request.token_by_token)
        seq = _Seq(request, stream, Sampler(sp, self._n_vocab, mask),
                   self.tokenizer.detokenizer(request.prompt_token_ids[-4:], request.shown_special_ids,
                                              escaped_tags(request)),
                   stop_ids, request.lora or BASE_ADAPTER, len(request.prompt_token_ids))
        self._inbox.put(seq)
        return RequestStream(request.request_id, stream, self.abort)

    async def embed(self, token_ids: list[int]) -> list[float]:
        """See ``Engine.embed``: the mean of the last entry of ``hidden_states`` (after the
        model's final norm), on the worker thread, without LoRA adapters."""
        if not 0 < len(token_ids) <= self.model_info.context_length:
            raise EngineError(f"an embedding input takes 1 to {self.model_info.context_length} tokens, "
                              f"not {len(token_ids)}")
        return await self._on_worker(lambda: self._embed(token_ids))

    async def load_lora_adapter(self, name: str, path: str) -> None:
        """See ``Engine.load_lora_adapter``: checked against the model's weights first (a PEFT
        adapter that does not fit would change the model's modules before failing), then loaded
        with PEFT on the worker thread, between steps."""
        await asyncio.to_thread(check_adapter, name, Path(path), self._resolved.path)

        def load() -> None:
            self._loaded.model = add_adapter(self._loaded.model, name, path)
            self._loaded.adapters = (*self._loaded.adapters, name)
            self.model_info = self.model_info.with_lora_adapters((*self.model_info.lora_adapters, name))

        await self._on_worker(load)

    async def unload_lora_adapter(self, name: str) -> None:
        """See ``Engine.unload_lora_adapter``: removed on the worker thread, between steps."""
        self.model_info = self.model_info.with_lora_adapters(
            tuple(a for a in self.model_info.lora_adapters if a != name))

        def free() -> None:
            self._end_where(lambda seq: seq.adapter == name, f"LoRA adapter {name!r} was unloaded")
            self._loaded.model = remove_adapter(self._loaded.model, name)
            self._loaded.adapters = tuple(a for a in self._loaded.adapters if a != name)
            log.info("LoRA adapter %s unloaded", name)

        await self._on_worker(free)

    # ---- worker thread (StepWorker hooks) -------------------------------------------------

    def _has_work(self) -> bool:
        return bool(self._waiting or self._batch_seqs)

    def _add(self, seq: _Seq) -> None:
        if seq.adapter != BASE_ADAPTER and seq.adapter not in self.model_info.lora_adapters:
            self._finish(seq, "error", f"LoRA adapter {seq.adapter!r} was unloaded")  # since it was admitted
            return
        self._by_id[seq.request.request_id] = seq
        self._waiting.append(seq)

    def _lookup(self, request_id: str) -> _Seq | None:
        return self._by_id.get(request_id)

    def _num_generated(self, seq: _Seq) -> int:
        return seq.num_generated

    def _running(self) -> list[_Seq]:
        return self._batch_seqs

    def _unfinished(self) -> list[_Seq]:
        return [*self._batch_seqs, *self._waiting]

    def _step(self) -> None:
        with torch.inference_mode():
            self._admit()
            if self._batch_seqs:
                self._decode()

    def _after_aborts(self) -> None:
        self._waiting = deque(s for s in self._waiting if not s.done)
        self._compact()

    def _after_failed_step(self) -> None:
        self._batch_seqs, self._batch = [], PaddedKVBatch()

    def _forward_kwargs(self, seqs: list[_Seq]) -> dict:
        return {"adapter_names": [s.adapter for s in seqs]} if self._has_adapters() else {}

    def _has_adapters(self) -> bool:
        """The model is a ``PeftModel`` now (worker thread; ``model_info.lora_adapters`` already
        leaves out an adapter being unloaded while its last requests run)."""
        return self._loaded.adapters != ()

    def _admit(self) -> None:
        """Prefill waiting requests into free rows, round robin across tenants (``in_turn``)."""
        if len(self._waiting) > 1 and len(self._batch_seqs) < self.settings.max_num_seqs:
            order = in_turn(self._waiting, self._batch_seqs, lambda seq: seq.request.tenant)
            self._waiting = self._waiting if order is None else deque(order)
        while self._waiting and len(self._batch_seqs) < self.settings.max_num_seqs:
            seq = self._waiting.popleft()
            try:
                logits, cache = self._prefill(seq)
            except Exception as exc:  # this request's inputs broke the forward: end it alone
                log.exception("prefill of %s failed", seq.request.request_id)
                self._finish(seq, "error", f"{type(exc).__name__}: {exc}")
                continue
            self._emit(seq, *self._sample([seq], logits)[0])
            if not seq.done:
                self._batch.add(cache, seq.num_prompt)
                self._batch_seqs.append(seq)

    def _prefill(self, seq: _Seq) -> tuple[torch.Tensor, DynamicCache]:
        model, device = self._loaded.model, self._loaded.device
        ids = torch.tensor([seq.request.prompt_token_ids], dtype=torch.long, device=device)
        extra = {k: v.to(device) for k, v in (seq.request.multimodal or {}).items()}
        cache = self._new_cache()
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids), past_key_values=cache, use_cache=True,
                    logits_to_keep=1, **extra, **self._forward_kwargs([seq]))
        seq.position = seq.num_prompt
        seq.rope_delta = self._take_rope_delta()
        return out.logits[:, -1, :], cache

    def _new_cache(self) -> DynamicCache:
        """A one-sequence cache: full layers (the padded batch keeps every position), built from
        the model's layer types when its attention keeps an indexer key cache beside K/V
        (``indexed_attention``: GLM-5's and DeepSeek-V3.2's sparse attention)."""
        config = self._loaded.model.config
        text_config = config.get_text_config(decoder=True)
        if "indexed_attention" in (getattr(text_config, "layer_types", None) or ()):
            return DynamicCache(config=config)
        return DynamicCache()

    def _take_rope_delta(self) -> int:
        """The ``rope_deltas`` a multimodal-RoPE model stored during the prefill (then cleared,
        so the next prefill starts fresh); 0 for other models."""
        inner = getattr(self._loaded.model, "get_base_model", lambda: self._loaded.model)()
        inner = getattr(inner, "model", None)
        delta = getattr(inner, "rope_deltas", None)
        if delta is None:
            return 0
        inner.rope_deltas = None
        return int(torch.as_tensor(delta).reshape(-1)[0])

    def _decode(self) -> None:
        seqs, device = self._batch_seqs, self._loaded.device
        ids = torch.tensor([[s.last_token] for s in seqs], dtype=torch.long, device=device)
        positions = torch.tensor([[s.position + s.rope_delta] for s in seqs], dtype=torch.long, device=device)
        mask = self._batch.next_mask()
        out = self._loaded.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                                 past_key_values=self._batch.cache, use_cache=True, logits_to_keep=1,
                                 **self._forward_kwargs(seqs))
        self._batch.advance(mask)
        tokens = self._sample(seqs, out.logits[:, -1, :])
        for seq, (token, logprob) in zip(seqs, tokens):
            seq.position += 1
            self._emit(seq, token, logprob)
        if any(s.done for s in seqs):
            self._compact()

    def _sample(self, seqs: list[_Seq], logits: torch.Tensor) -> list[tuple[int, TokenLogprob | None]]:
        """(token, its logprobs when the request asked) per row of ``logits``."""
        logits = logits.float()
        if all(s.sampler.plain_greedy for s in seqs):
            tokens = logits.argmax(dim=-1).tolist()
        else:
            tokens = [s.sampler.sample(row) for s, row in zip(seqs, logits.cpu())]
        return [(t, None if s.request.sampling.logprobs is None else token_logprob(row, t, s.request.sampling.logprobs))
                for s, t, row in zip(seqs, tokens, logits)]

    def _embed(self, token_ids: list[int]) -> list[float]:
        ids = torch.tensor([token_ids], dtype=torch.long, device=self._loaded.device)
        base = {"adapter_names": [BASE_ADAPTER]} if self._has_adapters() else {}
        with torch.inference_mode():
            out = self._loaded.model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False,
                                     output_hidden_states=True, logits_to_keep=1, **base)
            mean = out.hidden_states[-1][0].float().mean(dim=0)
            return torch.nn.functional.normalize(mean, dim=0).cpu().tolist()

    def _compact(self) -> None:
        keep = [i for i, s in enumerate(self._batch_seqs) if not s.done]
        self._batch.keep(keep)
        self._batch_seqs = [self._batch_seqs[i] for i in keep]

    def _emit(self, seq: _Seq, token: int, logprob: TokenLogprob | None = None) -> None:
        seq.last_token = token
        seq.num_generated += 1
        seq.sampler.accept(token)
        finish = finish_reason(token, seq.stop_ids, seq.num_generated, seq.num_prompt + seq.num_generated,
                               seq.request.sampling.max_tokens, self.model_info.context_length)
        text = "" if finish == "stop" else seq.detok.feed(token)
        if finish is not None:
            text += seq.detok.flush()
        self._outputs.add(seq.stream, GenerationOutput(seq.request.request_id, [token], text, finish, None,
                                                       seq.num_prompt, 0, None if logprob is None else [logprob]))
        if finish is not None:
            self._finish(seq, finish, send=False)

    def _finish(self, seq: _Seq, reason: FinishReason, error: str | None = None, send: bool = True) -> None:
        if seq.done:
            return
        seq.done = True
        self._by_id.pop(seq.request.request_id, None)
        self._release(seq.stream, seq.request.request_id, reason, error, seq.num_prompt, 0, send, seq.request.tenant)
