"""The text-completions handler (``/v1/completions``): prompts as they are, no chat template.

Each prompt (a string, or token ids; a request may hold a list of either) is one engine request,
admitted together and run concurrently; its text is choice ``index`` of the reply. Admission,
stop strings, metrics and aborts are the chat handler's (``ChatService.admit`` and
``ChatService.deltas``), so both endpoints behave alike.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing

from glmserve.protocol.chat import PromptTokensDetails, Usage
from glmserve.protocol.completions import Completion, CompletionChoice, CompletionRequest
from glmserve.engine.types import GenerationRequest
from glmserve.protocol.errors import APIError, ErrorResponse, invalid_request
from glmserve.serving.chat import ChatService, ChunkStream, Run
from glmserve.serving.prompt import fit_max_tokens
from glmserve.serving.sampling import logit_bias, stop_strings, to_sampling_params


def check_supported(req: CompletionRequest) -> None:
    """Raise a 400 ``APIError`` for the options this server does not implement yet."""
    if req.n != 1 or (req.best_of or 1) != 1:
        raise invalid_request("only n=1 (and best_of=1) is supported", "n", "unsupported_parameter")
    if req.logprobs is not None:
        raise invalid_request("logprobs are not supported yet", "logprobs", "unsupported_parameter")
    if req.suffix:
        raise invalid_request("suffix (insertion) is not supported", "suffix", "unsupported_parameter")


class CompletionService:
    """Serve ``/v1/completions`` over a ``ChatService`` (model names, engine, admission).

    ``create(req)`` returns a ``Completion`` or, for ``stream=True``, an async iterator of
    ``Completion`` chunks (ending with an ``ErrorResponse`` if generation fails after the
    stream began). Client errors raise ``APIError`` before anything is generated."""

    def __init__(self, chat: ChatService) -> None:
        self.chat = chat
        self.tokenizer = chat.engine.tokenizer

    async def create(self, req: CompletionRequest) -> Completion | AsyncIterator[Completion | ErrorResponse]:
        self.chat.check_model(req.model)
        check_supported(req)
        bias = logit_bias(req, self.tokenizer.n_vocab)
        prompts = await asyncio.to_thread(self._token_prompts, req)
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        loop = asyncio.get_running_loop()
        runs: list[Run] = []
        try:
            for i, ids in enumerate(prompts):
                param = "prompt" if len(prompts) == 1 else f"prompt.{i}"
                max_tokens = fit_max_tokens(len(ids), req.max_tokens, self.chat.context_length, param)
                request = GenerationRequest(
                    request_id=f"{rid}-{i}", prompt_token_ids=ids,
                    sampling=to_sampling_params(req, max_tokens, (), None, bias),
                    lora=req.model if req.model in self.chat.adapters else None)
                run = Run(rid, created, request, stop_strings(req), None, model=req.model)
                run.outputs = await asyncio.to_thread(self.chat.admit, req.model, request, loop)
                runs.append(run)
        except BaseException:
            for run in runs:  # all or nothing: a refused prompt aborts the admitted ones
                await run.outputs.aclose()
            raise
        if not req.echo:
            echoes = [""] * len(runs)
        elif isinstance(req.prompt, str) or isinstance(req.prompt[0], str):
            echoes = [req.prompt] if isinstance(req.prompt, str) else list(req.prompt)  # the client's own text
        else:
            echoes = [self.tokenizer.decode(run.request.prompt_token_ids) for run in runs]
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return ChunkStream(self._stream(runs, echoes, include_usage), *(run.outputs for run in runs))
        texts, finishes = [""] * len(runs), [None] * len(runs)
        async with aclosing(self._chunks(runs, echoes)) as chunks:
            async for item in chunks:
                if isinstance(item, APIError):
                    raise item
                for choice in item.choices:
                    texts[choice.index] += choice.text
                    finishes[choice.index] = choice.finish_reason or finishes[choice.index]
        return Completion(id=rid, created=created, model=req.model, usage=_usage(runs),
                          choices=[CompletionChoice(index=i, text=t, finish_reason=f)
                                   for i, (t, f) in enumerate(zip(texts, finishes))])

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

    async def _stream(self, runs: list[Run], echoes: list[str],
                      include_usage: bool) -> AsyncIterator[Completion | ErrorResponse]:
        """The SSE items: chunks, an error body if a run failed, the usage chunk if asked for."""
        async with aclosing(self._chunks(runs, echoes)) as chunks:
            async for item in chunks:
                if isinstance(item, APIError):
                    yield item.body()
                    return
                yield item
        if include_usage:
            first = runs[0]
            yield Completion(id=first.id, created=first.created, model=first.model, choices=[], usage=_usage(runs))

    async def _chunks(self, runs: list[Run], echoes: list[str]) -> AsyncIterator[Completion | APIError]:
        """Chunks of every run as they come (``choices[0].index`` says which prompt; the echoed
        prompt first); a failed run's ``APIError`` ends them, aborting the others."""
        queue: asyncio.Queue = asyncio.Queue()
        first = runs[0]

        def chunk(index: int, text: str, finish: str | None = None) -> Completion:
            return Completion(id=first.id, created=first.created, model=first.model,
                              choices=[CompletionChoice(index=index, text=text, finish_reason=finish)])

        async def pump(index: int, run: Run) -> None:
            try:
                if echoes[index]:
                    await queue.put(chunk(index, echoes[index]))
                async with aclosing(self.chat.deltas(run)) as deltas:
                    async for text, finish in deltas:
                        await queue.put(chunk(index, text, finish))
            except APIError as exc:
                await queue.put(exc)
            finally:
                await queue.put(None)

        tasks = [asyncio.create_task(pump(i, run)) for i, run in enumerate(runs)]
        try:
            remaining = len(tasks)
            while remaining:
                item = await queue.get()
                if item is None:
                    remaining -= 1
                else:
                    yield item
                    if isinstance(item, APIError):
                        return
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


def _usage(runs: list[Run]) -> Usage:
    prompt = sum(len(r.request.prompt_token_ids) for r in runs)
    completion = sum(r.completion_tokens for r in runs)
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion,
                 prompt_tokens_details=PromptTokensDetails(cached_tokens=sum(r.cached_tokens for r in runs)))
