"""The OpenAI error envelope and the exception that carries it.

Wire shape (OpenAI API reference): ``{"error": {"message", "type", "param", "code"}}``.
Every error a client can cause is an ``APIError`` value with its HTTP status; the HTTP layer
turns it into a response (``server/errors.py``), and streams send the same body as an event.
"""

from __future__ import annotations

from pydantic import BaseModel


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo


class APIError(Exception):
    """An error with an HTTP status and an OpenAI error body.

    ``headers`` are extra response headers (``Retry-After`` for 429).
    """

    def __init__(
        self,
        status_code: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> ErrorResponse:
        return ErrorResponse(
            error=ErrorInfo(message=self.message, type=self.type, param=self.param, code=self.code)
        )


def invalid_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    """400 ``invalid_request_error``."""
    return APIError(400, message, "invalid_request_error", param, code)


def model_not_found(model: str) -> APIError:
    """404 ``model_not_found``, as OpenAI answers an unknown ``model``."""
    return APIError(
        404,
        f"The model '{model}' does not exist or you do not have access to it.",
        "invalid_request_error",
        "model",
        "model_not_found",
    )


def context_length_exceeded(message: str, param: str = "messages") -> APIError:
    """400 ``context_length_exceeded``: the prompt (plus ``max_tokens``) does not fit."""
    return APIError(400, message, "invalid_request_error", param, "context_length_exceeded")


class PromptTooLong(APIError):
    """400 ``context_length_exceeded`` for a prompt that alone fills the context, in OpenAI's
    words; ``n_prompt`` and ``context_length`` (tokens) let another API say it in its own
    (Anthropic's ``prompt is too long: N tokens > M maximum``)."""

    def __init__(self, n_prompt: int, context_length: int, noun: str, param: str) -> None:
        super().__init__(400, f"This model's maximum context length is {context_length} tokens. However, your "
                              f"{noun} resulted in {n_prompt} tokens. Please reduce the length of the {noun}.",
                         "invalid_request_error", param, "context_length_exceeded")
        self.n_prompt, self.context_length = n_prompt, context_length


def overloaded(message: str, retry_after_s: int) -> APIError:
    """429 with ``Retry-After``: every running and queued place is taken."""
    return APIError(429, message, "rate_limit_error", None, "rate_limit_exceeded",
                    headers={"Retry-After": str(retry_after_s)})


def server_error(message: str) -> APIError:
    """500 ``server_error``: a failure inside the server, not the client's fault."""
    return APIError(500, message, "server_error", None, "internal_error")
