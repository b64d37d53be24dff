"""The chat template's extra variables for a request (``enable_thinking``, ``reasoning_effort``,
``clear_thinking``...), from the server's defaults, the request's fields and its
``chat_template_kwargs``; and the defaults the agent routes add."""

from __future__ import annotations

from typing import Any

from glmserve.chat import RESERVED_TEMPLATE_VARIABLES
from glmserve.protocol.chat import ChatCompletionRequest
from glmserve.protocol.errors import invalid_request

# Agent routes (/v1/messages, /v1/responses) render past reasoning in every turn (GLM-4.7's
# ``clear_thinking`` false, GLM-5.3's default), so that the prompt of the next request extends
# this one's and the prefix cache covers it after a user reply (docs/guides/reasoning.md, "Preserved thinking").
PRESERVED_THINKING: dict[str, Any] = {"clear_thinking": False}


# the thinking budget a ``reasoning_effort`` sets on a template that does not read the variable
# (GLM-4.5-4.7, Qwen3, R1 distills; GLM-5.x templates have their own levels): reasoning tokens,
# None for no limit. "none" and "minimal" also turn thinking off where the template can.
EFFORT_BUDGETS: dict[str, int | None] = {"none": 0, "minimal": 0, "low": 1024, "medium": 8192, "high": None,
                                         "xhigh": None, "max": None}


def reads_effort(template_source: str | None) -> bool:
    """Whether a chat template reads ``reasoning_effort`` (GLM-5.x's own levels)."""
    return bool(template_source) and "reasoning_effort" in template_source


def template_kwargs(req: ChatCompletionRequest, server_defaults: dict[str, Any]) -> dict[str, Any]:
    """The chat template's extra variables for ``req``: ``server_defaults``
    (``--default-chat-template-kwargs``), then ``reasoning_effort`` as ``enable_thinking``
    (``none``/``minimal``: off) and as itself (GLM-5.x templates read ``reasoning_effort``), then
    the request's ``chat_template_kwargs``. A variable the template does not use is harmless (as
    in vLLM). Raises 400 for a name the server sets itself (``messages``, ``tools``...)."""
    kwargs = dict(server_defaults)
    if req.reasoning_effort is not None:
        kwargs["enable_thinking"] = req.reasoning_effort not in ("none", "minimal")
        kwargs["reasoning_effort"] = req.reasoning_effort
    for name, value in (req.chat_template_kwargs or {}).items():
        if name in RESERVED_TEMPLATE_VARIABLES:
            raise invalid_request(f"chat_template_kwargs cannot set {name!r}: the server sets it",
                                  f"chat_template_kwargs.{name}")
        kwargs[name] = value
    return kwargs


def with_template_defaults(req: ChatCompletionRequest, defaults: dict[str, Any],
                           server_defaults: dict[str, Any]) -> ChatCompletionRequest:
    """``req`` with ``defaults`` (variables a route sets, e.g. ``PRESERVED_THINKING``) under its
    own ``chat_template_kwargs`` and ``server_defaults``: either of those wins."""
    extra = {k: v for k, v in defaults.items() if k not in server_defaults}
    kwargs = {**extra, **(req.chat_template_kwargs or {})}
    return req.model_copy(update={"chat_template_kwargs": kwargs or None})
