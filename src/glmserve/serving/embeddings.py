"""``/v1/embeddings``: OpenAI's embeddings over the engine's ``embed`` (mean-pooled,
L2-normalised last hidden states of the served model; see ``Engine.embed``).

Each input is embedded alone, so a request of several inputs gives exactly the vectors of
as many single requests; the inputs of a request are queued on the engine's thread one by one,
between generation steps, so running generations go on between them. A string is tokenized as
a prompt (the model's BOS token added when it wants one); token ids are taken as they are.
"""

from __future__ import annotations

import asyncio
import base64
import struct

from glmserve.protocol.embeddings import Embedding, EmbeddingRequest, EmbeddingResponse, EmbeddingUsage
from glmserve.protocol.errors import context_length_exceeded, invalid_request, server_error
from glmserve.engine.base import EngineError
from glmserve.serving.generation.pipeline import ModelPipeline


def encode_base64(vector: list[float]) -> str:
    """``encoding_format: "base64"``: the vector as little-endian float32 bytes, base64 encoded
    (what the ``openai`` SDK decodes with ``numpy.frombuffer(..., dtype="float32")``)."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


class EmbeddingsService:
    """Serve ``/v1/embeddings`` for the model of ``chat``. ``max_inputs``: inputs per request;
    ``max_tokens``: tokens per request, all inputs together (each input also fits the model's
    context). ``create`` raises ``APIError``: 404 for an unknown ``model``, 400 for a LoRA adapter's
    name, a model the engine cannot embed with, ``dimensions`` other than the model's size, or
    bad or too large ``input``."""

    def __init__(self, pipeline: ModelPipeline, max_inputs: int = 2048, max_tokens: int = 32768) -> None:
        self.pipeline = pipeline
        self.engine = pipeline.engine
        self.max_inputs = max_inputs
        self.max_tokens = max_tokens

    async def create(self, req: EmbeddingRequest) -> EmbeddingResponse:
        """The request's vectors. Admitted as a generation is (``ModelPipeline.bounded``): at
        most ``max_num_seqs + max_queue`` embedding requests at once, else the server's 429
        (``Retry-After``), so a client cannot queue work on the engine's thread without bound."""
        self._check(req)
        async with self.pipeline.bounded("embeddings", req.model):
            inputs = await asyncio.to_thread(self._token_ids, req.input)
            try:
                vectors = await asyncio.gather(*(self.engine.embed(ids) for ids in inputs))
            except (EngineError, RuntimeError) as exc:  # the engine's failure, not the client's
                raise server_error(f"embedding failed: {exc}") from exc
        data = [Embedding(index=i, embedding=encode_base64(v) if req.encoding_format == "base64" else v)
                for i, v in enumerate(vectors)]
        n = sum(len(ids) for ids in inputs)
        return EmbeddingResponse(data=data, model=req.model, usage=EmbeddingUsage(prompt_tokens=n, total_tokens=n))

    def _check(self, req: EmbeddingRequest) -> None:
        if req.model in self.pipeline.adapters:
            raise invalid_request(f"embeddings are computed without LoRA adapters: ask for model "
                                  f"{self.pipeline.name!r}, not the adapter {req.model!r}", "model")
        size = self.engine.model_info.embedding_size
        if size is None:
            raise invalid_request(f"model {req.model!r} does not serve embeddings on this engine", "model")
        if req.dimensions is not None and req.dimensions != size:
            raise invalid_request(f"this model's embeddings have {size} dimensions; it cannot give "
                                  f"{req.dimensions}", "dimensions")

    def _token_ids(self, value: str | list) -> list[list[int]]:
        """The request's inputs as token ids (blocking: tokenizes). Raises ``APIError`` 400."""
        single = isinstance(value, str) or bool(value) and isinstance(value[0], int)
        items: list = [value] if single else value
        if not items:
            raise invalid_request("input must not be empty", "input")
        if len(items) > self.max_inputs:
            raise invalid_request(f"input has {len(items)} items; at most {self.max_inputs} are allowed", "input")
        tokenizer, n_ctx = self.engine.tokenizer, self.pipeline.context_length
        out: list[list[int]] = []
        total = 0
        for i, item in enumerate(items):
            where = "input" if single else f"input[{i}]"
            ids = self._tokenize(item, where) if isinstance(item, str) else item
            if not ids:
                raise invalid_request(f"{where} is empty", "input")
            bad = [t for t in ids if not 0 <= t < tokenizer.n_vocab]
            if bad:
                raise invalid_request(f"{where}: not token ids of this model (0 to {tokenizer.n_vocab - 1}): "
                                      f"{bad[:10]}", "input")
            if len(ids) > n_ctx:
                raise context_length_exceeded(f"{where} has {len(ids)} tokens; this model's maximum context "
                                              f"length is {n_ctx} tokens", "input")
            total += len(ids)
            if total > self.max_tokens:
                raise invalid_request(f"input has more than {self.max_tokens} tokens in all (--max-embedding-tokens)",
                                      "input")
            out.append(ids)
        return out

    def _tokenize(self, text: str, where: str) -> list[int]:
        if not text:
            raise invalid_request(f"{where} is an empty string", "input")
        try:
            return self.engine.tokenizer.encode_prompt(text)
        except UnicodeEncodeError as exc:
            raise invalid_request(f"{where} contains invalid Unicode (a lone surrogate)", "input") from exc

