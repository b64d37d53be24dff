"""Render a conversation with the model's own chat template.

Semantics follow Hugging Face ``PreTrainedTokenizerBase.apply_chat_template`` (transformers
``utils/chat_template_utils.py``): a Jinja2 ``ImmutableSandboxedEnvironment`` with
``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols`` extension, a ``tojson`` filter that
keeps non-ASCII text (``ensure_ascii=False``), and the globals ``raise_exception`` and
``strftime_now``. Variables: ``messages``, ``tools``, ``add_generation_prompt``, ``bos_token``,
``eos_token`` and any extra keyword (for example ``enable_thinking``).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


# the variables the server itself renders a template with: not for ``chat_template_kwargs``
RESERVED_TEMPLATE_VARIABLES = frozenset({"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"})


class ChatTemplateError(ValueError):
    """The template rejected the conversation (its ``raise_exception``) or failed to render.

    The message is meant for the client (a 400)."""


# transformers' marker for continue_final_message (utils/chat_template_utils.py)
CONTINUE_MARKER = "CONTINUE_FINAL_MESSAGE_TAG "


def _with_marker(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with ``CONTINUE_MARKER`` after the final message's text (its last text part
    when the content is a list). Raises ``ChatTemplateError`` when it has no text."""
    if not messages:
        raise ChatTemplateError("there is no final message to continue")
    final = dict(messages[-1])
    content = final.get("content")
    if isinstance(content, str):
        final["content"] = content + CONTINUE_MARKER
    elif isinstance(content, list) and any(isinstance(p, dict) and "text" in p for p in content):
        parts = list(content)
        last = max(i for i, p in enumerate(parts) if isinstance(p, dict) and "text" in p)
        parts[last] = {**parts[last], "text": parts[last]["text"] + CONTINUE_MARKER}
        final["content"] = parts
    else:
        raise ChatTemplateError("the final message has no text to continue")
    return [*messages[:-1], final]


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


class ChatTemplate:
    """A compiled chat template plus the special tokens it is rendered with.

    Raises ``ChatTemplateError`` at construction if the template does not compile.
    """

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "") -> None:
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"chat template does not compile: {exc}") from exc

    def render(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        **kwargs: Any,
    ) -> str:
        """The prompt text for ``messages`` (dicts with ``role``, ``content`` and optional
        ``tool_calls``/``name``...). ``continue_final_message``: the prompt ends inside the last
        message, right after its text, so that the model continues it (a prefill), as
        transformers' ``apply_chat_template`` does it: the text is rendered with a marker after
        it and the prompt cut at the marker. Raises ``ChatTemplateError`` with the template's
        message (also when the template does not write the final message's text as given)."""
        if continue_final_message:
            messages = _with_marker(messages)
        try:
            text = self._template.render(
                messages=messages,
                tools=tools,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                **kwargs,
            )
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(str(exc) or type(exc).__name__) from exc
        except (TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:
            raise ChatTemplateError(f"chat template failed to render: {exc}") from exc
        if continue_final_message:
            at = text.rfind(CONTINUE_MARKER.strip())
            if at < 0:
                raise ChatTemplateError("the chat template does not write the final message's text, so it "
                                        "cannot be continued")
            text = text[:at] if text.startswith(CONTINUE_MARKER, at) else text[:at].rstrip()
        return text

    def end_of_turn_text(self) -> str:
        """The text the template writes right after an assistant reply and before the next
        turn (ChatML: ``"<|im_end|>\\n<|im_start|>user\\n"``; GLM-4: ``"<|user|>\\n"``).

        The first special token in it is the model's end-of-turn token. Empty when the template
        cannot render the probe conversation.
        """
        reply, follow = "glmserve-probe-reply", "glmserve-probe-next"
        probe = [
            {"role": "user", "content": "glmserve-probe-question"},
            {"role": "assistant", "content": reply},
            {"role": "user", "content": follow},
        ]
        try:
            text = self.render(probe, add_generation_prompt=False)
        except ChatTemplateError:
            return ""
        start, end = text.find(reply), text.find(follow)
        if start < 0 or end < start:
            return ""
        return text[start + len(reply):end]


# ChatML, used when a model ships no template (the most common chat layout).
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
