"""``/tokenize`` and ``/detokenize``: the model's own token ids for a prompt or a conversation
(rendered exactly as a chat request would be), and text for token ids, so that clients can
count tokens exactly."""

from __future__ import annotations

from glmserve.protocol.chat import ChatCompletionRequest
from glmserve.protocol.errors import invalid_request
from glmserve.protocol.tokenize import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeChatRequest,
    TokenizeRequest,
    TokenizeResponse,
)
from glmserve.serving.generation.pipeline import ModelPipeline


class TokenizeService:
    """Over a ``ModelPipeline`` (its names, template, tool format and tokenizer). Both
    methods are blocking (tokenizing a long prompt takes a while): call them off the event
    loop. They raise ``APIError`` 400 for bad input (the request's ``model`` was resolved to
    this model by the router)."""

    def __init__(self, pipeline: ModelPipeline) -> None:
        self.pipeline = pipeline
        self.tokenizer = pipeline.engine.tokenizer

    def tokenize(self, req: TokenizeRequest) -> TokenizeResponse:
        if isinstance(req, TokenizeChatRequest):
            chat = ChatCompletionRequest(model=self.pipeline.name, messages=req.messages, tools=req.tools)
            ids = self.pipeline.prompt_token_ids(chat)
        else:
            try:
                ids = self.tokenizer.encode_prompt(req.prompt) if req.add_special_tokens else self.tokenizer.encode(
                    req.prompt)
            except UnicodeEncodeError as exc:
                raise invalid_request("the prompt contains invalid Unicode (a lone surrogate)", "prompt") from exc
        strs = [self.tokenizer.decode([t]) for t in ids] if req.return_token_strs else None
        return TokenizeResponse(count=len(ids), max_model_len=self.pipeline.context_length, tokens=ids, token_strs=strs)

    def detokenize(self, req: DetokenizeRequest) -> DetokenizeResponse:
        n_vocab = self.tokenizer.n_vocab
        bad = [t for t in req.tokens if not 0 <= t < n_vocab]
        if bad:
            raise invalid_request(f"not token ids of this model (0 to {n_vocab - 1}): {bad[:10]}", "tokens")
        return DetokenizeResponse(prompt=self.tokenizer.decode(req.tokens))
