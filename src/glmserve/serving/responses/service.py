"""``/v1/responses`` (OpenAI's Responses API), stateless, on top of the chat handler: the
request's ``input`` items become chat messages (``serving/responses/request.py``), the chat reply
stream becomes the ``response`` object or its typed events (``serving/responses/render.py``).
Storing, ``previous_response_id`` and background runs are ``serving/responses/stored.py``'s: it
hands this service the whole input and keeps what comes back.

Reasoning items sent back in ``input`` are replayed to the template as the turn's
``reasoning_content`` (sealed ones opened, ``serving/responses/sealed_reasoning.py``), and past
reasoning is kept in the prompt (``PRESERVED_THINKING``). ``truncation: "auto"`` drops the
oldest turns (whole: from one user message to the next) until the prompt fits the context; the
instructions and system/developer messages before the first turn stay.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

from glmserve.engine.types import INTERACTIVE_PRIORITY
from glmserve.protocol.chat import ChatCompletionRequest
from glmserve.protocol.errors import ErrorResponse, invalid_request
from glmserve.protocol.responses import INCLUDABLE, Response, ResponseEvent, ResponsesRequest
from glmserve.serving.chat.service import ChatService
from glmserve.serving.generation.chunks import ChunkStream
from glmserve.serving.generation.pipeline import ModelPipeline
from glmserve.serving.generation.reply import collect
from glmserve.serving.generation.sampling import with_defaults
from glmserve.serving.generation.template_vars import PRESERVED_THINKING, with_template_defaults
from glmserve.serving.responses.render import ResponseEvents, response
from glmserve.serving.responses.request import function_tools, to_chat_request
from glmserve.serving.responses.sealed_reasoning import ReasoningSeal


def _checked(req: ResponsesRequest, seal: ReasoningSeal | None) -> None:
    """400s for what this server does not do: ``include`` values other than ``INCLUDABLE``,
    logprobs."""
    for i, value in enumerate(req.include or []):
        if value not in INCLUDABLE:
            raise invalid_request(f"include {value!r} is not served here (one of {', '.join(sorted(INCLUDABLE))})",
                                  f"include.{i}")
    if "reasoning.encrypted_content" in (req.include or []) and seal is None:
        raise invalid_request("this server has no key to seal reasoning with", "include")
    if req.top_logprobs:
        raise invalid_request("logprobs are not returned on /v1/responses here (chat completions returns them)",
                              "top_logprobs")


def _turn_starts(roles: list[str]) -> tuple[int, list[int]]:
    """``(lead, starts)``: how many system/developer messages lead the conversation, and the
    indices ``truncation: "auto"`` may cut it at (each user message after the first turn)."""
    lead = next((i for i, role in enumerate(roles) if role not in ("system", "developer")), len(roles))
    return lead, [i for i in range(lead + 1, len(roles)) if roles[i] == "user"]


class ResponsesService:
    """Serve ``/v1/responses`` over a ``ChatService``. ``create(req)`` returns a ``Response``
    or, for ``stream=True``, an async iterator of ``ResponseEvent``s. Client errors raise
    ``APIError`` before anything is generated. ``seal`` seals and opens reasoning's
    ``encrypted_content`` (None: asking for it is a 400)."""

    def __init__(self, pipeline: ModelPipeline, chat: ChatService, seal: ReasoningSeal | None = None) -> None:
        self.pipeline, self.chat = pipeline, chat
        self.seal = seal

    def _open(self, token: str, param: str) -> str:
        if self.seal is None:
            raise invalid_request("this server has no key to open encrypted_content with", param)
        return self.seal.open(token, param)

    async def create(self, req: ResponsesRequest, priority: int = INTERACTIVE_PRIORITY,
                     encoded: bool = False) -> Response | AsyncIterator[ResponseEvent | ErrorResponse | str]:
        """The response, or for ``stream`` its events (``encoded``: some as their JSON, see the
        module docstring). Raises ``APIError`` before anything is generated."""
        _checked(req, self.seal)
        tools, namespaces = function_tools(req)
        chat_req = with_template_defaults(to_chat_request(req, tools, self._open), PRESERVED_THINKING,
                                          self.pipeline.default_template_kwargs)
        if req.truncation == "auto":
            chat_req = await asyncio.to_thread(self._truncated, chat_req)
        seal = self.seal.seal if "reasoning.encrypted_content" in (req.include or []) else None
        used, _ = with_defaults(chat_req, self.pipeline.generation_defaults)  # the sampling generation uses
        shell = Response(id=f"resp_{uuid.uuid4().hex}", created_at=int(time.time()), status="in_progress", model=req.model,
                         instructions=req.instructions, tools=req.tools or [],
                         tool_choice=req.tool_choice if req.tool_choice is not None else "auto",
                         truncation=req.truncation or "disabled",
                         parallel_tool_calls=req.parallel_tool_calls is not False,
                         temperature=1.0 if used.temperature is None else used.temperature,
                         top_p=1.0 if used.top_p is None else used.top_p,
                         presence_penalty=used.presence_penalty, frequency_penalty=used.frequency_penalty,
                         reasoning=req.reasoning.model_dump(exclude_none=True) if req.reasoning else None,
                         max_output_tokens=req.max_output_tokens, max_tool_calls=req.max_tool_calls,
                         metadata=req.metadata or {}, user=req.user, store=bool(req.store),
                         background=bool(req.background), previous_response_id=req.previous_response_id,
                         conversation={"id": req.conversation} if req.conversation else None,
                         safety_identifier=req.safety_identifier,
                         prompt_cache_key=req.prompt_cache_key,
                         text=req.text.model_dump(by_alias=True, exclude_none=True) if req.text else {
                             "format": {"type": "text"}})
        reply = await self.chat.reply(chat_req, priority=priority)
        if not req.stream:
            return response(shell, await collect(reply), namespaces, seal)
        return ChunkStream(ResponseEvents(reply, shell, namespaces, seal, encoded).events(), reply)

    def _truncated(self, req: ChatCompletionRequest) -> ChatCompletionRequest:
        """``req`` without its oldest turns, as few as make the prompt fit the context with room
        for ``max_tokens`` (one token when unset); unchanged when it fits, or when even its last
        turn alone does not (the chat handler's 400 says so)."""
        room = self.pipeline.context_length - (req.max_completion_tokens or req.max_tokens or 1)
        messages = req.messages
        lead, starts = _turn_starts([m.role for m in messages])

        def cut(at: int) -> ChatCompletionRequest:
            return req.model_copy(update={"messages": messages[:lead] + messages[at:]})

        def fits(r: ChatCompletionRequest) -> bool:
            return len(self.pipeline.prompt_token_ids(r)) <= room

        if not starts or fits(req):
            return req
        lo, hi = 0, len(starts) - 1  # the first cut that fits, if the last does
        if not fits(cut(starts[hi])):
            return req
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if fits(cut(starts[mid])) else (mid + 1, hi)
        return cut(starts[lo])
