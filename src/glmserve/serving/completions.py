"""The text-completions handler (``/v1/completions``): prompts as they are, no chat template.

Each prompt (a string, or token ids; a request may hold a list of either) gives ``n`` engine
requests, all admitted together and run concurrently: choice ``p * n + j`` is prompt ``p``'s
``j``-th sample. Admission,
stop strings, metrics and aborts are the model's shared pipeline (``ModelPipeline.admit`` and
``ModelPipeline.deltas``), as for chat, so both endpoints behave alike.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing

from glmserve.engine.rules import model_text
from glmserve.engine.types import INTERACTIVE_PRIORITY
from glmserve.protocol.completions import Completion, CompletionChoice, CompletionLogprobs, CompletionRequest
from glmserve.engine.types import GenerationRequest, TokenLogprob
from glmserve.protocol.errors import APIError, ErrorResponse, invalid_request
from glmserve.serving.generation.request_scope import engine_scope
from glmserve.serving.generation.pipeline import ModelPipeline
from glmserve.serving.generation.chunks import ChunkStream
from glmserve.serving.generation.run import Run, usage
from glmserve.serving.generation.merge import merged
from glmserve.serving.generation.prompt import fit_max_tokens
from glmserve.serving.generation.sampling import (
    check_n,
    choice_sampling,
    logit_bias,
    stop_strings,
    to_sampling_params,
    with_defaults,
)


def check_supported(req: CompletionRequest) -> None:
    """Raise a 400 ``APIError`` for the options this server does not implement yet."""
    if req.best_of is not None and req.best_of != req.n:
        raise invalid_request("best_of (ranking more samples than n) is not supported", "best_of",
                              "unsupported_parameter")
    if req.logprobs is not None and req.echo:
        raise invalid_request("logprobs of the echoed prompt are not supported: use echo or logprobs",
                              "logprobs", "unsupported_parameter")
    if req.suffix:
        raise invalid_request("suffix (insertion) is not supported", "suffix", "unsupported_parameter")


class CompletionService:
    """Serve ``/v1/completions`` for a ``ModelPipeline`` (its names, engine, admission).

    ``create(req)`` returns a ``Completion`` or, for ``stream=True``, an async iterator of
    ``Completion`` chunks (ending with an ``ErrorResponse`` if generation fails after the
    stream began). Client errors raise ``APIError`` before anything is generated."""

    def __init__(self, pipeline: ModelPipeline) -> None:
        self.pipeline = pipeline
        self.tokenizer = pipeline.engine.tokenizer

    async def create(self, req: CompletionRequest,
                     priority: int = INTERACTIVE_PRIORITY) -> Completion | AsyncIterator[Completion | ErrorResponse]:
        req, ceiling = with_defaults(req, self.pipeline.generation_defaults)
        check_supported(req)
        check_n(req.n, self.pipeline.max_n)
        bias = logit_bias(req, self.tokenizer.n_vocab)
        prompts = await asyncio.to_thread(self._token_prompts, req)
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        runs: list[Run] = []
        stops = stop_strings(req)
        for p, ids in enumerate(prompts):
            param = "prompt" if len(prompts) == 1 else f"prompt.{p}"
            n_ctx = self.pipeline.context_length
            max_tokens = min(req.max_tokens, max(1, n_ctx - len(ids))) if ceiling else req.max_tokens
            sampling = to_sampling_params(req, fit_max_tokens(len(ids), max_tokens, self.pipeline.context_length, param),
                                          (), None, bias)
            for j in range(req.n):  # choice p * n + j
                request = GenerationRequest(
                    request_id=f"{rid}-{p * req.n + j}", prompt_token_ids=ids, sampling=choice_sampling(sampling, j),
                    lora=req.model if req.model in self.pipeline.adapters else None, priority=priority,
                    shown_special_ids=self.pipeline.shown_special_ids, token_by_token=bool(stops), **engine_scope())
                runs.append(Run(rid, created, request, stops, None, model=req.model, index=p * req.n + j))
        await self.pipeline.admit_all(runs)
        if not req.echo:
            echoes = [""] * len(runs)
        elif isinstance(req.prompt, str) or isinstance(req.prompt[0], str):  # the client's own text
            echoes = [text for text in ([req.prompt] if isinstance(req.prompt, str) else req.prompt)
                      for _ in range(req.n)]
        else:
            echoes = [self.tokenizer.decode(run.request.prompt_token_ids) for run in runs]
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return ChunkStream(self._stream(runs, echoes, include_usage, len(prompts)), *(run.outputs for run in runs))
        choices = [CompletionChoice(index=i, text="", logprobs=CompletionLogprobs() if run.wants_logprobs else None)
                   for i, run in enumerate(runs)]
        async with aclosing(self._chunks(runs, echoes)) as chunks:
            async for item in chunks:
                if isinstance(item, APIError):
                    raise item
                for part in item.choices:
                    whole = choices[part.index]
                    whole.text += part.text
                    whole.finish_reason = part.finish_reason or whole.finish_reason
                    if part.logprobs is not None:
                        for name in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
                            getattr(whole.logprobs, name).extend(getattr(part.logprobs, name))
        return Completion(id=rid, created=created, model=req.model, usage=usage(runs, len(prompts)), choices=choices)

    def _token_prompts(self, req: CompletionRequest) -> list[list[int]]:
        """Each prompt as token ids (text gets the model's BOS when it wants one). Raises 400
        for ids outside the vocabulary, an empty prompt or invalid Unicode."""
        prompts = req.prompt if isinstance(req.prompt, list) and req.prompt and not isinstance(req.prompt[0], int) \
            else [req.prompt]
        out = []
        for i, prompt in enumerate(prompts):
            param = "prompt" if len(prompts) == 1 else f"prompt.{i}"
            if isinstance(prompt, str):
                try:
                    ids = self.tokenizer.encode_prompt(prompt)
                except UnicodeEncodeError as exc:
                    raise invalid_request("the prompt contains invalid Unicode (a lone surrogate)", param) from exc
            else:
                ids = list(prompt)
                bad = [t for t in ids if t >= self.tokenizer.n_vocab]
                if bad:
                    raise invalid_request(f"not token ids of this model (0 to {self.tokenizer.n_vocab - 1}): "
                                          f"{bad[:10]}", param)
            if not ids:
                raise invalid_request("the prompt is empty", param)
            out.append(ids)
        return out

    async def _stream(self, runs: list[Run], echoes: list[str], include_usage: bool,
                      n_prompts: int) -> AsyncIterator[Completion | ErrorResponse]:
        """The SSE items: chunks, an error body if a run failed, the usage chunk if asked for."""
        async with aclosing(self._chunks(runs, echoes)) as chunks:
            async for item in chunks:
                if isinstance(item, APIError):
                    yield item.body()
                    return
                yield item
        if include_usage:
            first = runs[0]
            yield Completion(id=first.id, created=first.created, model=first.model, choices=[],
                             usage=usage(runs, n_prompts))

    async def _chunks(self, runs: list[Run], echoes: list[str]) -> AsyncIterator[Completion | APIError]:
        """Chunks of every run as they come (``choices[0].index`` says which prompt; the echoed
        prompt first); a failed run's ``APIError`` ends them, aborting the others."""
        first = runs[0]
        offsets = [0] * len(runs)  # characters of each choice's text so far

        async def texts(index: int, run: Run) -> AsyncIterator[tuple[str, str | None, list[TokenLogprob]]]:
            if echoes[index]:
                yield echoes[index], None, []
            async for text, finish, logprobs in self.pipeline.deltas(run):
                yield model_text(run.request, text), finish, logprobs  # tags as the model wrote them

        try:
            async for i, (text, finish, logprobs) in merged([texts(i, run) for i, run in enumerate(runs)]):
                choice = CompletionChoice(index=i, text=text, finish_reason=finish)
                if runs[i].wants_logprobs:
                    choice.logprobs = self._logprobs(logprobs, offsets[i])
                offsets[i] += len(text)
                yield Completion(id=first.id, created=first.created, model=first.model, choices=[choice])
        except APIError as exc:
            yield exc

    def _logprobs(self, logprobs: list[TokenLogprob], offset: int) -> CompletionLogprobs:
        """The legacy shape for ``logprobs``, the first token starting at ``offset``."""
        out = CompletionLogprobs()
        for lp in logprobs:
            token = self.tokenizer.decode([lp.token_id])
            out.tokens.append(token)
            out.token_logprobs.append(lp.logprob)
            out.top_logprobs.append({self.tokenizer.decode([tid]): v for tid, v in lp.top})
            out.text_offset.append(offset)
            offset += len(token)
        return out
