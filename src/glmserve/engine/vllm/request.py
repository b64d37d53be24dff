"""One request's outputs on the ``vllm`` engine, read from ``AsyncLLM.generate`` in the
consumer's own task.

vLLM's output handler task puts each step's outputs into every request's collector; the reader
of ``VllmRequestStream`` takes them from there directly, as vLLM's own server does: no task of
glmserve's per request and no queue hop per token between the collector and the serving layer
(a second task woken per token per stream cost the API process CPU time that vLLM's server does
not spend, ``benchmarks/serving_overhead.py --vllm-model``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing

from vllm import SamplingParams as VllmSamplingParams
from vllm.inputs import TokensPrompt

try:  # a prompt already rendered (token ids): vLLM checks it on the event loop, no thread hop
    from vllm.inputs.engine import tokens_input
except ImportError:  # pragma: no cover - vLLM before rendered inputs: token ids are taken as they are
    def tokens_input(prompt_token_ids: list[int]) -> TokensPrompt:
        return TokensPrompt(prompt_token_ids=prompt_token_ids)
from vllm.lora.request import LoRARequest
from vllm.v1.engine.async_llm import AsyncLLM

from glmserve.engine.base import one_line
from glmserve.engine.hf_tokenizer import HFTokenizer
from glmserve.engine.rules import escaped_tags
from glmserve.engine.types import FinishReason, GenerationOutput, GenerationRequest, TokenLogprob

try:  # vLLM's request errors (4xx to its own server): VLLMClientError in newer vLLM, ValueError before
    from vllm.exceptions import VLLMClientError
except ImportError:  # pragma: no cover - older vLLM
    VLLMClientError = ValueError

log = logging.getLogger("glmserve.engine.vllm")

# vLLM's finish reasons -> glmserve's (vLLM's "repetition" stop is a stop too)
_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort", "error": "error"}


class VllmRequestStream:
    """The async iterator of one request's ``GenerationOutput``; the last has ``finish_reason``
    set (also when vLLM fails or aborts the request). The request enters vLLM at the first
    ``__anext__``, in the reader's task. ``aclose()`` before the last output aborts it in vLLM
    (which frees the sequence at its next step); ``release`` (the admission slot) is called
    once however the stream ends, also when it is never read."""

    __slots__ = ("request_id", "_outputs", "_release", "_started", "_done", "__weakref__")

    def __init__(self, llm: AsyncLLM, tokenizer: HFTokenizer, request: GenerationRequest,
                 params: VllmSamplingParams, lora_request: LoRARequest | None, release: Callable[[], None]) -> None:
        self.request_id = request.request_id
        self._release = _once(release)
        self._outputs = _outputs(llm, tokenizer, request, params, lora_request, self._release)
        self._started = self._done = False

    def __aiter__(self) -> VllmRequestStream:
        return self

    async def __anext__(self) -> GenerationOutput:
        if self._done:
            raise StopAsyncIteration
        self._started = True
        output = await anext(self._outputs)
        self._done = output.finished
        return output

    async def aclose(self) -> None:
        self._done = True
        if self._started:
            await self._outputs.aclose()  # its finally releases; vLLM aborts on GeneratorExit
        self._release()

    def __del__(self) -> None:
        if not self._started:  # a started one is closed by the event loop's async generator hooks
            self._release()


def _once(release: Callable[[], None]) -> Callable[[], None]:
    done = False

    def release_once() -> None:
        nonlocal done
        if not done:
            done = True
            release()

    return release_once


async def _outputs(llm: AsyncLLM, tokenizer: HFTokenizer, request: GenerationRequest, params: VllmSamplingParams,
                   lora_request: LoRARequest | None, release: Callable[[], None]) -> AsyncGenerator[GenerationOutput]:
    """``AsyncLLM.generate``'s token-id deltas of ``request`` as ``GenerationOutput``: detokenized
    here (``HFTokenizer.detokenizer``, its special tokens shown as the request asks), the stop
    token that ended it not shown, vLLM's failure as ``finish_reason="error"`` (``invalid``
    when vLLM refused the prompt before any output: a 400).

    vLLM's generator is read to its end (it ends right after the output with the finish
    reason), so a request that finished is not aborted; closed before (this generator closed at
    a ``yield``, or its reader's task cancelled), it aborts the request in vLLM."""
    request_id, prompt = request.request_id, request.prompt_token_ids
    detok = tokenizer.detokenizer(prompt[-4:], request.shown_special_ids, escaped_tags(request))
    stop_ids = frozenset(params.stop_token_ids or ())
    want = params.logprobs  # top logprobs asked for (None: none)
    n_prompt, n_generated, n_cached = len(prompt), 0, 0
    # token ids go in rendered (no renderer pass, no thread hop per request, in vLLM's own
    # server's form); with images, vLLM's multimodal processor expands the placeholders first
    engine_prompt = tokens_input(prompt) if request.multimodal is None else \
        TokensPrompt(prompt_token_ids=prompt, multi_modal_data=request.multimodal)
    if request.cache_salt is not None:
        engine_prompt["cache_salt"] = request.cache_salt  # vLLM's prefix caching keeps salts apart
    last: GenerationOutput | None = None
    try:
        async with aclosing(llm.generate(engine_prompt, params, request_id, lora_request=lora_request,
                                         priority=request.priority)) as outs:  # priority: --scheduling-policy
            async for out in outs:
                n_prompt = len(out.prompt_token_ids) if out.prompt_token_ids else n_prompt
                completion = out.outputs[0]
                n_cached = out.num_cached_tokens or n_cached
                tokens = list(completion.token_ids)
                n_generated += len(tokens)
                finish = _FINISH.get(completion.finish_reason, "stop") if completion.finish_reason else None
                shown = tokens[:-1] if finish == "stop" and tokens and tokens[-1] in stop_ids else tokens
                text = detok.feed(shown[0]) if len(shown) == 1 else "".join(detok.feed(t) for t in shown)
                if finish is not None:
                    text += detok.flush()
                output = GenerationOutput(request_id, tokens, text, finish, None, n_prompt, n_cached,
                                          None if want is None else _logprobs(tokens, completion.logprobs, want))
                if finish is None:
                    yield output
                else:
                    last = output
        if last is None:
            last = GenerationOutput(request_id, finish_reason="error", num_prompt_tokens=n_prompt,
                                    num_cached_tokens=n_cached, error="vLLM ended the request without a finish reason")
    except (GeneratorExit, asyncio.CancelledError):  # the reader left (client gone); vLLM aborted the request
        log.info("request %s aborted after %d tokens", request_id, n_generated)
        raise
    except Exception as exc:  # a failed request (or a dead engine core) ends this request only
        # vLLM's check of the prompt at admission, before any output: a 400
        invalid = isinstance(exc, (VLLMClientError, ValueError)) and n_generated == 0
        if invalid:
            log.info("request %s refused by vLLM: %s", request_id, one_line(exc))
        else:
            log.error("request %s failed in vLLM: %s", request_id, one_line(exc))
        last = GenerationOutput(request_id, finish_reason="error", invalid=invalid, num_prompt_tokens=n_prompt,
                                num_cached_tokens=n_cached,
                                error=one_line(exc) if invalid else f"{type(exc).__name__}: {one_line(exc)}")
    finally:
        release()  # before the last output: its reader may stop reading there
    yield last


def _logprobs(tokens: list[int], per_token, k: int) -> list[TokenLogprob] | None:
    """vLLM's per-token ``{token id: Logprob}`` (the sampled token and the top ``k``, ranked;
    raw log-probabilities, vLLM's default ``logprobs_mode``) as glmserve's."""
    if per_token is None:
        return None
    out = []
    for token, entries in zip(tokens, per_token):
        ranked = sorted(((tid, e) for tid, e in entries.items() if e.rank is not None and e.rank <= k),
                        key=lambda item: item[1].rank)
        out.append(TokenLogprob(token, entries[token].logprob, tuple((tid, e.logprob) for tid, e in ranked[:k])))
    return out
