"""Where ``glmserve chat`` gets its replies: a model in-process (``LLM``) or any
OpenAI-compatible server (the ``openai`` client). Both stream chunks shaped like
``ChatCompletionChunk`` (``choices[0].delta.content``, ``usage`` on the last)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from glmserve.settings.model import ModelSettings
from glmserve.settings.serve import ChatSettings


class ChatError(RuntimeError):
    """A failure to show the user as one line (server unreachable, wrong key, no model)."""


class LocalBackend:
    def __init__(self, settings: ChatSettings) -> None:
        from glmserve.llm import LLM
        from glmserve.runtime.start import STARTUP_ERRORS

        # the model flags the user set (and only those: an engine refuses a flag it does not use);
        # a server's flags were refused on the command line, and a server's variables in the
        # environment are that server's
        given = {k: getattr(settings, k) for k in ModelSettings.model_fields
                 if k in settings.model_fields_set and k != "model"}
        try:
            self._llm = LLM(model=settings.model, **given)
        except STARTUP_ERRORS as exc:
            raise ChatError(f"cannot load the model: {exc}") from exc
        self.model = self._llm.model
        self.where = "in-process"

    def stream(self, messages: list[dict], **params: Any) -> Iterator:
        from glmserve.protocol.errors import APIError

        try:
            yield from self._llm.chat(messages, stream=True, **params)
        except APIError as exc:
            raise ChatError(exc.message) from exc

    def models(self) -> list[tuple[str, str]]:
        """``(id, status)`` of each model this backend can chat with: the one in-process."""
        return [(self.model, "loaded")]

    def close(self) -> None:
        self._llm.close()


class RemoteBackend:
    def __init__(self, settings: ChatSettings) -> None:
        import openai

        from glmserve.bench.runner import api_base

        self._openai = openai
        # --api-key is a list (the serve flag's: keys split at commas); the first is the one sent
        self._client = openai.OpenAI(base_url=api_base(settings.url), api_key=next(iter(settings.api_key), "none"),
                                     max_retries=0, timeout=600)
        self.where = settings.url
        try:
            self.model = settings.model or self._client.models.list().data[0].id
        except (openai.APIError, IndexError) as exc:
            raise ChatError(self._describe(exc)) from exc

    def _describe(self, exc: Exception) -> str:
        o = self._openai
        if isinstance(exc, o.APIConnectionError):
            return f"cannot reach {self.where}"
        if isinstance(exc, o.AuthenticationError):
            return f"{self.where} refused the API key (use --api-key)"
        if isinstance(exc, o.NotFoundError):
            return f"{self.where}: model not found"
        if isinstance(exc, o.APIStatusError):
            return f"{self.where} answered {exc.status_code}: {exc.message}"
        if isinstance(exc, IndexError):
            return f"{self.where} serves no model"
        return f"{type(exc).__name__}: {exc}"

    def models(self) -> list[tuple[str, str]]:
        """``(id, status)`` of each model the server lists (``status`` from a glmserve of several
        models: loaded, loading, unloaded; else "-"). Raises ``ChatError``."""
        try:
            cards = self._client.models.list().data
        except self._openai.APIError as exc:
            raise ChatError(self._describe(exc)) from exc
        return [(card.id, (card.model_extra or {}).get("status", "-")) for card in cards]

    def stream(self, messages: list[dict], **params: Any) -> Iterator:
        try:
            stream = self._client.chat.completions.create(
                model=self.model, messages=messages, stream=True, stream_options={"include_usage": True}, **params)
            with stream:  # leaving early closes the connection: the server aborts the reply
                yield from stream
        except self._openai.APIError as exc:
            raise ChatError(self._describe(exc)) from exc

    def close(self) -> None:
        self._client.close()


def make_backend(settings: ChatSettings) -> LocalBackend | RemoteBackend:
    """Raises ``ChatError``."""
    return RemoteBackend(settings) if settings.url else LocalBackend(settings)
