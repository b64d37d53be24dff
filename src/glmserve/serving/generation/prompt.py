"""Chat request -> prompt token ids, with the context-window checks.

The prompt is rendered with the model's chat template (``chat/``) and tokenized by the engine's
tokenizer; it is never truncated: a prompt that does not fit is a 400
``context_length_exceeded``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Protocol

from glmserve.chat import ChatTemplate, ChatTemplateError, UnsupportedContentError, to_template_messages
from glmserve.engine.base import Tokenizer
from glmserve.protocol.chat import ChatCompletionRequest
from glmserve.protocol.errors import PromptTooLong, context_length_exceeded, invalid_request
from glmserve.chat.plain_text import PlainText
from glmserve.chat.normalize import PromptNormalizer
from glmserve.serving.generation.tool_formats import render_prompt
from glmserve.serving.generation.tools import ToolPlan
from glmserve.toolcalls.reasoning import THINK_END, prompt_state


class MultimodalProcessor(Protocol):
    """An engine's image processor (``engine.multimodal``): the prompt text and its images ->
    token ids with the image tokens expanded, plus the engine's own model inputs. Raises
    ``ValueError`` when the processor refuses them."""

    def process(self, text: str, images: list[Any]) -> tuple[list[int], Any]: ...


@dataclass(slots=True)
class Prompt:
    text: str
    token_ids: list[int]
    max_tokens: int  # tokens the reply may use, resolved against the context window
    multimodal: Any = None  # the engine's inputs for the images, if any
    messages: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # rendered (the miss report's)


def special_token_id(tokenizer: Tokenizer, text: str) -> int | None:
    """The id of ``text`` where the vocabulary holds it as one special token (``<|user|>``,
    or ``</think>`` in a GGUF that marks it as a control token), else None."""
    token_id = single_token_id(tokenizer, text)
    return token_id if token_id is not None and tokenizer.is_special(token_id) else None


def single_token_id(tokenizer: Tokenizer, text: str) -> int | None:
    """The id of ``text`` where the vocabulary holds it as one token, special or not (GLM's
    ``<tool_call>``, a control token in a converted GGUF, an added token in another), else None."""
    ids = tokenizer.encode(text)
    return ids[0] if len(ids) == 1 else None


def end_of_turn_token_ids(template: ChatTemplate, tokenizer: Tokenizer) -> tuple[int, ...]:
    """The special token the template closes an assistant turn with (``<|im_end|>`` for
    ChatML, ``<|user|>`` for GLM-4), as a 1-tuple, or ``()`` when there is none."""
    text = template.end_of_turn_text()
    for token_id in tokenizer.encode(text) if text else []:
        if tokenizer.is_special(token_id):
            return (token_id,)
    return ()


def build_prompt(
    req: ChatCompletionRequest,
    template: ChatTemplate,
    tokenizer: Tokenizer,
    context_length: int,
    max_tokens: int | None,
    plan: ToolPlan | None = None,
    tool_format: str | None = None,
    images: list[Any] | None = None,
    processor: MultimodalProcessor | None = None,
    check_fit: bool = True,
    template_kwargs: dict[str, Any] | None = None,
    max_tokens_ceiling: bool = False,
    plain: PlainText | None = None,
    normalize: PromptNormalizer | None = None,
) -> Prompt:
    """Render and tokenize ``req.messages``; resolve ``max_tokens`` (None: what is left of the
    context). ``plan``'s offered tools go where ``tool_format`` (a ``TOOL_FORMATS`` name) puts
    them (its ``render``: ``serving/generation/tool_formats.py``); ``plan.forced_prefix`` is appended after
    the generation prompt. ``images`` (decoded, in conversation order) go through the
    engine's ``processor``, whose token count (image tokens included) is what must fit (unless
    ``check_fit`` is false: ``/tokenize`` counts any prompt). ``req.add_generation_prompt`` and
    ``req.continue_final_message`` (vLLM's fields: end the prompt inside the final message, a
    prefill the model continues) reach the template. ``template_kwargs``: extra
    template variables (``enable_thinking``...); ``max_tokens_ceiling``: lower a ``max_tokens``
    that does not fit to what the prompt leaves instead of refusing it; ``plain``: the texts the
    messages and tools hold as ordinary text (``chat/plain_text.py``; images aside);
    ``normalize``: what is removed from the messages first (``chat/normalize.py``,
    ``--prompt-normalize``). Raises ``APIError`` 400 for content the model cannot take, a template that rejects the conversation, or a
    prompt/``max_tokens`` that does not fit."""
    try:
        messages = to_template_messages(req.messages, vision=processor is not None)
    except UnsupportedContentError as exc:
        raise invalid_request(str(exc), exc.param) from exc
    if normalize is not None:
        messages = normalize(messages)
    plan = plan or ToolPlan()
    kwargs = {**(template_kwargs or {}), "add_generation_prompt": req.add_generation_prompt,
              "continue_final_message": req.continue_final_message}
    guarded = (plain or PlainText(())).guard(messages, [plan.offered, plan.functions])
    shown = dataclasses.replace(plan, offered=guarded.tools[0], functions=guarded.tools[1])
    try:
        text = render_prompt(template, guarded.messages, shown, tool_format, kwargs)
        if plan.grammar is not None and prompt_state(text) == "reasoning":
            text = _reasoning_closed(template, guarded.messages, shown, tool_format, kwargs)
    except ChatTemplateError as exc:
        raise invalid_request(f"the model's chat template rejected the messages: {exc}", "messages") from exc
    text += plan.forced_prefix
    multimodal = None
    try:
        if images:
            text = guarded.text(text)
            token_ids, multimodal = processor.process(text, images)
        else:
            token_ids, text = guarded.token_ids(text, tokenizer), guarded.text(text)
    except UnicodeEncodeError as exc:  # JSON allows lone UTF-16 surrogates; UTF-8 does not
        raise invalid_request("the messages contain invalid Unicode (a lone surrogate)", "messages") from exc
    except ValueError as exc:
        raise invalid_request(str(exc), "messages") from exc
    n_prompt = len(token_ids)
    if not check_fit:
        return Prompt(text, token_ids, max_tokens or 0, multimodal, messages)
    if max_tokens_ceiling and max_tokens is not None:
        max_tokens = min(max_tokens, max(1, context_length - n_prompt))  # the prompt alone is checked below
    return Prompt(text, token_ids, fit_max_tokens(n_prompt, max_tokens, context_length, "messages"), multimodal,
                  messages)


def _reasoning_closed(template: ChatTemplate, messages: list[dict[str, Any]], plan: ToolPlan,
                      tool_format: str | None, kwargs: dict[str, Any]) -> str:
    """The prompt of a reply a grammar constrains from its first token (JSON, forced calls),
    on a template whose generation prompt opens the reasoning (GLM-4.7 / 5.x, Qwen3, R1
    distills): rendered with thinking off (``enable_thinking`` false: GLM-4.7 ends
    ``<|assistant|></think>``, Qwen3 ``<think>\n\n</think>``), or, where the template ignores
    that variable, with ``</think>`` appended. The grammar's output is then the answer, and
    the model writes it in the form it was trained on for thinking off, instead of JSON or a
    call forced where it was trained to reason (docs/guides/reasoning.md, "Structured output")."""
    text = render_prompt(template, messages, plan, tool_format, {**kwargs, "enable_thinking": False})
    return text + THINK_END if prompt_state(text) == "reasoning" else text


def fit_max_tokens(n_prompt: int, max_tokens: int | None, context_length: int, prompt_param: str) -> int:
    """``max_tokens`` resolved against the context window (None: what the prompt leaves).
    Raises a 400 ``context_length_exceeded`` naming ``prompt_param`` when the prompt alone does
    not fit (``PromptTooLong``), or ``max_tokens`` when the two together do not."""
    noun = "messages" if prompt_param == "messages" else "prompt"  # OpenAI's wording for each
    if n_prompt >= context_length:
        raise PromptTooLong(n_prompt, context_length, noun, prompt_param)
    if max_tokens is None:
        return context_length - n_prompt
    if n_prompt + max_tokens > context_length:
        raise context_length_exceeded(
            f"This model's maximum context length is {context_length} tokens. However, you "
            f"requested {n_prompt + max_tokens} tokens ({n_prompt} in the {noun}, {max_tokens} "
            f"in the completion). Please reduce the length of the {noun} or completion.",
            param="max_tokens",
        )
    return max_tokens
