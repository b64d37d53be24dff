"""glmserve's extension of each API's ``usage``: where the prompt's prefill started (the miss
report, ``chat/cache_report.py``), so that a client sees why a prompt was computed again.

It rides in the object that holds the cached-token count: chat and completions'
``usage.prompt_tokens_details``, the Responses API's ``usage.input_tokens_details``, and
Anthropic's ``usage`` (beside ``cache_read_input_tokens``). The vendors' SDKs keep an unknown
field (``model_extra``), and a client that does not know it ignores it; it is left out where
there is no report."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, SerializerFunctionWrapHandler, model_serializer


class PrefillReport(BaseModel):
    """``token``: the first prompt token computed (the tokens before it were read from the
    prefix cache: the cached-token count); ``message``: the index of the message whose text holds
    it in the messages the chat template rendered (the system prompt first, as Anthropic's
    ``system`` becomes), with its ``role``; when the token is in what the template writes between
    two messages' texts (a role marker, the tools after the system message), ``message`` and
    ``role`` are null and ``after`` is the index of the message before (null: before the first
    one). No message fields for a prompt given as text or tokens (completions). Only the fields
    given are written."""

    token: int
    message: int | None = None
    role: str | None = None
    after: int | None = None

    @model_serializer(mode="wrap")
    def _set_fields_only(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if k in self.model_fields_set}  # as reported


class WithPrefillReport(BaseModel):
    """A usage object (or its details object) that may carry ``prefill_start``: written after
    the vendor's fields, left out when None whatever the dump's options."""

    prefill_start: PrefillReport | None = None

    @model_serializer(mode="wrap")
    def _without_none_report(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data = handler(self)
        report = data.pop("prefill_start", None)
        if report is not None:
            data["prefill_start"] = report  # after the vendor's own fields
        return data
