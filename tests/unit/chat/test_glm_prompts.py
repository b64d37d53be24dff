"""GLM prompts: an agent conversation in OpenAI form, mapped and rendered by glmserve, is exactly
what the published template renders through Hugging Face's ``apply_chat_template`` for the
same conversation in the model's own form; stop tokens come from the tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

from glmserve.chat import ChatTemplate, to_template_messages
from glmserve.chat.glm4 import to_glm4_items
from glmserve.engine.hf_tokenizer import HFTokenizer
from glmserve.protocol.chat import ChatCompletionRequest
from glmserve.serving.generation.prompt import end_of_turn_token_ids
from glmserve.toolcalls import PARSERS
from tests.unit.glm_tokenizer import glm_tokenizer

FIXTURES = Path(__file__).parents[2] / "fixtures" / "glm"
GLM4 = (FIXTURES / "glm-4-9b-chat.jinja").read_text(encoding="utf-8")
GLM46 = (FIXTURES / "glm-4.6.jinja").read_text(encoding="utf-8")
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "查询天气",
                                             "parameters": {"type": "object", "properties": {
                                                 "city": {"type": "string"}, "days": {"type": "integer"}}}}}]
OPENAI_CONVERSATION = [
    {"role": "system", "content": "You are a weather assistant."},
    {"role": "user", "content": "北京明天天气怎么样?"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
        "name": "get_weather", "arguments": json.dumps({"city": "北京", "days": 1}, ensure_ascii=False)}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"weather": "晴", "temp": 25}'},
]


def _openai_messages():
    req = ChatCompletionRequest.model_validate({"model": "glm", "messages": OPENAI_CONVERSATION, "tools": TOOLS})
    return to_template_messages(req.messages)


def test_glm4_agent_conversation_matches_the_template():
    tok = glm_tokenizer(GLM4)
    ours = ChatTemplate(GLM4, eos_token="<|endoftext|>").render(to_glm4_items(_openai_messages(), TOOLS))
    native = [  # the conversation as GLM-4's demo passes it to the template
        {"role": "system", "content": None, "tools": TOOLS, "metadata": ""},
        {"role": "system", "content": "You are a weather assistant.", "metadata": ""},
        {"role": "user", "content": "北京明天天气怎么样?", "metadata": ""},
        {"role": "assistant", "metadata": "get_weather", "content": '{"city": "北京", "days": 1}'},
        {"role": "observation", "content": '{"weather": "晴", "temp": 25}', "metadata": ""},
    ]
    reference = tok.apply_chat_template(native, tokenize=False, add_generation_prompt=True)
    assert ours == reference
    assert ours.startswith("[gMASK]<sop><|system|>\n你是一个名为 ChatGLM 的人工智能助手")
    assert ours.endswith('<|assistant|>get_weather\n{"city": "北京", "days": 1}'
                         '<|observation|>\n{"weather": "晴", "temp": 25}<|assistant|>')
    assert '## get_weather\n\n{\n    "name": "get_weather",\n    "description": "查询天气"' in ours


def test_glm45_agent_conversation_matches_the_template():
    tok = glm_tokenizer(GLM46)
    ours = ChatTemplate(GLM46).render(_openai_messages(), tools=TOOLS)
    reference = tok.apply_chat_template(_openai_messages(), tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert ours == reference
    assert "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>北京</arg_value>\n" \
           "<arg_key>days</arg_key>\n<arg_value>1</arg_value>\n</tool_call>" in ours
    assert '<|observation|>\n<tool_response>\n{"weather": "晴", "temp": 25}\n</tool_response><|assistant|>' in ours


def test_stop_tokens_come_from_the_tokenizer():
    for template, parser in ((GLM4, "glm4"), (GLM46, "glm45")):
        hf = glm_tokenizer(template)
        tok = HFTokenizer(hf)
        assert end_of_turn_token_ids(ChatTemplate(template), tok) == (hf.convert_tokens_to_ids("<|user|>"),)
        ids = [tok.encode(marker) for marker in PARSERS[parser].end_of_turn]
        assert ids == [[hf.convert_tokens_to_ids("<|observation|>")], [hf.convert_tokens_to_ids("<|user|>")]]
        assert all(tok.is_special(i[0]) for i in ids)
