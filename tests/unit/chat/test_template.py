"""Chat template rendering: Hugging Face ``apply_chat_template`` semantics, GLM templates."""

from __future__ import annotations

from pathlib import Path

import pytest

from glmserve.chat import CHATML_TEMPLATE, ChatTemplate, ChatTemplateError, to_template_messages
from glmserve.protocol.chat import ChatCompletionRequest

FIXTURES = Path(__file__).parents[2] / "fixtures" / "glm"
GLM4 = (FIXTURES / "glm-4-9b-chat.jinja").read_text(encoding="utf-8")
GLM46 = (FIXTURES / "glm-4.6.jinja").read_text(encoding="utf-8")


def _msgs(*pairs):
    return [{"role": r, "content": c} for r, c in pairs]


def test_chatml_generation_prompt():
    t = ChatTemplate(CHATML_TEMPLATE)
    msgs = _msgs(("system", "S"), ("user", "Hi"))
    assert t.render(msgs) == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert t.render(msgs, add_generation_prompt=False).endswith("Hi<|im_end|>\n")


def test_glm4_layout():
    t = ChatTemplate(GLM4)
    text = t.render(_msgs(("system", "Be brief."), ("user", "Hello")))
    assert text == "[gMASK]<sop><|system|>\nBe brief.<|user|>\nHello<|assistant|>"


def test_glm4_tools_system_block_keeps_unicode_and_indent():
    t = ChatTemplate(GLM4)
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "天气",
                                                 "parameters": {"type": "object"}}}]
    text = t.render([{"role": "system", "content": None, "tools": tools}, *_msgs(("user", "北京天气?"))])
    assert text.startswith("[gMASK]<sop><|system|>\n你是一个名为 ChatGLM 的人工智能助手")
    assert "## get_weather\n\n{\n    \"name\": \"get_weather\",\n    \"description\": \"天气\"" in text
    assert text.endswith("<|user|>\n北京天气?<|assistant|>")


def test_glm46_renders_and_disables_thinking():
    t = ChatTemplate(GLM46)
    text = t.render(_msgs(("user", "Hi")), enable_thinking=False)
    assert text.startswith("[gMASK]<sop>")
    assert "<|user|>\nHi/nothink" in text
    assert text.endswith("<|assistant|>\n<think></think>")


def test_end_of_turn_text():
    assert ChatTemplate(CHATML_TEMPLATE).end_of_turn_text() == "<|im_end|>\n<|im_start|>user\n"
    assert ChatTemplate(GLM4).end_of_turn_text() == "<|user|>\n"
    assert ChatTemplate(GLM46).end_of_turn_text().startswith("<|user|>")


def test_bos_and_eos_variables():
    t = ChatTemplate("{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}",
                     bos_token="<s>", eos_token="</s>")
    assert t.render(_msgs(("user", "a"), ("assistant", "b")), add_generation_prompt=False) == "<s>a</s>b</s>"


def test_raise_exception_becomes_template_error():
    t = ChatTemplate("{% if messages[0].role != 'user' %}{{ raise_exception('Conversation must start with user') }}{% endif %}")
    with pytest.raises(ChatTemplateError, match="Conversation must start with user"):
        t.render(_msgs(("assistant", "x")))
    assert t.render(_msgs(("user", "x"))) == ""


def test_trim_and_lstrip_blocks():
    t = ChatTemplate("{% for m in messages %}\n  {% if true %}\n{{ m.content }}\n  {% endif %}\n{% endfor %}")
    assert t.render(_msgs(("user", "a"), ("user", "b"))) == "a\nb\n"


def test_strftime_now_and_loopcontrols():
    t = ChatTemplate("{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m.content }}{% endfor %}"
                     "|{{ strftime_now('%Y') | length }}")
    assert t.render(_msgs(("user", "a"), ("user", "b"))) == "a|4"


def test_sandbox_blocks_attribute_escape():
    t = ChatTemplate("{{ ''.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(ChatTemplateError):
        t.render(_msgs(("user", "x")))


def test_template_mutation_is_blocked():
    t = ChatTemplate("{% set x = messages.append({'role': 'user'}) %}")
    with pytest.raises(ChatTemplateError):
        t.render(_msgs(("user", "x")))


def test_bad_template_does_not_compile():
    with pytest.raises(ChatTemplateError, match="does not compile"):
        ChatTemplate("{% for %}")


def test_openai_messages_mapping():
    req = ChatCompletionRequest.model_validate({"model": "m", "messages": [
        {"role": "developer", "content": "dev"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "42"},
    ]})
    out = to_template_messages(req.messages)
    assert out[0] == {"role": "system", "content": "dev"}
    assert out[1] == {"role": "user", "content": "a\nb"}
    assert out[2]["content"] == ""
    assert out[2]["tool_calls"][0]["function"] == {"name": "f", "arguments": {"x": 1}}
    assert out[3] == {"role": "tool", "content": "42", "tool_call_id": "call_1"}


def test_continue_final_message_ends_the_prompt_inside_it():
    """transformers' ``continue_final_message``: the prompt stops right after the final
    message's text (string or last text part), with no end-of-turn and no generation prompt."""
    template = ChatTemplate(CHATML_TEMPLATE)
    ask = [{"role": "user", "content": "Capital of France?"}]
    text = template.render([*ask, {"role": "assistant", "content": "It is"}], add_generation_prompt=False,
                           continue_final_message=True)
    assert text.endswith("<|im_start|>assistant\nIt is") and "CONTINUE" not in text
    assert text == template.render(ask) + "It is"  # the generation prompt, then the prefill
    parts = ChatTemplate("{% for m in messages %}[{% for p in m.content %}{{ p.text }}{% endfor %}]{% endfor %}")
    said = [{"role": "assistant", "content": [{"type": "text", "text": "It"}, {"type": "text", "text": " is"}]}]
    assert parts.render(said, add_generation_prompt=False, continue_final_message=True) == "[It is"
    with pytest.raises(ChatTemplateError, match="no text"):
        template.render([*ask, {"role": "assistant", "content": None}], continue_final_message=True)
