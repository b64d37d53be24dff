"""Request bodies of OpenAI's Batch API (``POST /v1/batches``) and Anthropic's Message Batches
(``POST /v1/messages/batches``)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from glmserve.protocol.chat import Metadata, _Lenient

MAX_MESSAGE_BATCH_REQUESTS = 100_000  # Anthropic's limit of requests in one message batch


class BatchCreateRequest(_Lenient):
    input_file_id: str
    endpoint: str
    completion_window: str = "24h"
    metadata: Metadata | None = None


class MessageBatchCreateRequest(_Lenient):
    requests: list[dict[str, Any]] = Field(min_length=1, max_length=MAX_MESSAGE_BATCH_REQUESTS)
