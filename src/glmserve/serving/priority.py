"""The engine priority of the request being served (``GenerationRequest.priority``, lower
first): 0 for interactive requests. The batch runner sets ``REQUEST_PRIORITY`` to
``BATCH_PRIORITY`` in each line's task (a context variable: it holds for that task only), and
the chat and completion services pass it to the engine. The llama_cpp engine schedules by it;
the transformers and vllm engines run every request at one priority."""

from __future__ import annotations

from contextvars import ContextVar

from glmserve.engine.types import BATCH_PRIORITY

REQUEST_PRIORITY: ContextVar[int] = ContextVar("glmserve_request_priority", default=0)

__all__ = ["BATCH_PRIORITY", "REQUEST_PRIORITY"]
