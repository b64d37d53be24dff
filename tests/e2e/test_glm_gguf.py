"""GLM on the default engine: every GLM text architecture as a GGUF made by llama.cpp's own
converter, served by ``--engine llama_cpp`` with the chat template the GGUF carries.

Each architecture (``tests/hf_models.py``: GLM-4-9B's ``GlmForCausalLM``, GLM-4-0414's
``Glm4ForCausalLM``, GLM-4.5-4.7's MoE with sigmoid gating, GLM-4.7-Flash's latent attention,
GLM-5's sparse-attention indexer) is built tiny with a GLM tokenizer, trained here to write its
generation's reasoning and tool call, converted to an f32 GGUF, and served. Through the
``openai`` and ``anthropic`` SDKs: the reasoning comes back as reasoning and the call as a call
(its arguments streamed in pieces by the GLM-4.5+ formats) on chat completions, messages and
responses; and on a prompt it was not trained on, the GGUF's greedy tokens are transformers'
from the same weights.

The GLM-4.5+ tokenizers hold ``<think>``, ``<tool_call>``, ``<arg_key>``... as added tokens; the
GLM-4.5 and GLM-4.7-Flash models here mark them special, which a GGUF keeps as control tokens
(llama.cpp detokenizes those to nothing), and GLM-5's keeps them as text: both parse alike.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anthropic
import openai
import pytest

from tests.conftest import RemoteServer

MODEL = "tiny-glm"
ASK = [{"role": "user", "content": "What is 2+2?"}]
THOUGHT, ANSWER, LOOK = "Two plus two makes four.", "The answer is 4.", "Look."
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}
ARGUMENTS = {"city": "Bonn am Rhein", "days": 3}
# each generation's reply and call, as its models write them (FORMAT.md)
GLM4_REPLY, GLM4_CALL = f"\n{ANSWER}", f"get_weather\n{json.dumps(ARGUMENTS)}"
GLM45_REPLY = f"\n<think>{THOUGHT}</think>\n{ANSWER}"
GLM45_CALL = (f"\n<think>{LOOK}</think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n"
              "<arg_value>Bonn am Rhein</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>")
GLM47_REPLY = f"{THOUGHT}</think>{ANSWER}"
GLM47_CALL = (f"{LOOK}</think><tool_call>get_weather<arg_key>city</arg_key><arg_value>Bonn am Rhein</arg_value>"
              "<arg_key>days</arg_key><arg_value>3</arg_value></tool_call>")
# what a model that reasons anyway writes after each template's thinking-off prompt (GLM-4.5/4.6:
# ``<|assistant|>\n<think></think>``; GLM-4.7: ``<|assistant|></think>``): reasoning opened again
THINKING_OFF_REPLY = {"glm-4.6.jinja": GLM45_REPLY, "glm-4.7.jinja": f"<think>{GLM47_REPLY}"}
# architecture: (template, the tag tokens of its tokenizer, reply, call, whether it reasons)
CASES = {
    "GlmForCausalLM": ("glm-4-9b-chat.jinja", None, GLM4_REPLY, GLM4_CALL, False),  # GLM-4-9B
    "Glm4ForCausalLM": ("glm-4-9b-chat.jinja", None, GLM4_REPLY, GLM4_CALL, False),  # GLM-4-0414
    "Glm4MoeForCausalLM": ("glm-4.6.jinja", "special", GLM45_REPLY, GLM45_CALL, True),  # GLM-4.5 / 4.6 / 4.7
    "Glm4MoeLiteForCausalLM": ("glm-4.7.jinja", "special", GLM47_REPLY, GLM47_CALL, True),  # GLM-4.7-Flash
    "GlmMoeDsaForCausalLM": ("glm-4.7.jinja", "text", GLM47_REPLY, GLM47_CALL, True),  # GLM-5
}
# llama.cpp's architecture name for each, as its converter writes it
GGUF_ARCHITECTURES = {"GlmForCausalLM": "chatglm", "Glm4ForCausalLM": "glm4", "Glm4MoeForCausalLM": "glm4moe",
                      "Glm4MoeLiteForCausalLM": "deepseek2", "GlmMoeDsaForCausalLM": "glm-dsa"}


class Served:
    def __init__(self, architecture: str, folder: Path, gguf: Path, server: RemoteServer) -> None:
        self.architecture, self.folder, self.gguf, self.server = architecture, folder, gguf, server
        self.template, self.tags, self.reply, self.call, self.reasons = CASES[architecture]
        self.openai = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)
        self.anthropic = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module", params=list(CASES), ids=list(CASES))
def glm(request, tmp_path_factory):
    pytest.importorskip("torch")
    from glmserve.chat.glm4 import to_glm4_items
    from tests.gguf_cache import converted_gguf
    from tests.hf_models import tiny_glm_trained

    architecture = request.param
    template, tags, reply, call, reasons = CASES[architecture]
    converter = Path(sys.prefix) / "share" / "llama.cpp" / "convert_hf_to_gguf.py"
    assert converter.is_file(), f"{converter} is missing: run `make install` (it extracts llama.cpp's converter)"
    # GLM-4's template reads the tools from a leading system item, as glmserve maps them (chat/glm4.py)
    asked = (to_glm4_items(ASK, [WEATHER]), {}) if template.startswith("glm-4-9b") else (ASK, {"tools": [WEATHER]})
    replies = [(ASK, {}, reply, "<|user|>"), (*asked, call, "<|observation|>")]
    if reasons:  # a model that reasons although thinking is off: the prompt with enable_thinking false
        # (the template closes the reasoning) is answered with reasoning of its own, opened anew
        replies.append((ASK, {"enable_thinking": False}, THINKING_OFF_REPLY[template], "<|user|>"))
    root = tmp_path_factory.mktemp(architecture)
    folder = tiny_glm_trained(root / MODEL, architecture, template, replies, tags=tags)
    gguf = converted_gguf(folder, root / f"{MODEL}.gguf", converter, tokenizer_pre="glm4")
    server = RemoteServer("--model", str(gguf), "--served-model-name", MODEL, "--n-ctx", "2048")
    yield Served(architecture, folder, gguf, server)
    server.stop()


def test_the_gguf_is_the_architecture_with_the_template_and_tag_tokens(glm):
    import gguf

    reader = gguf.GGUFReader(glm.gguf)
    assert reader.fields["general.architecture"].contents() == GGUF_ARCHITECTURES[glm.architecture]
    assert reader.fields["tokenizer.ggml.pre"].contents() == "glm4"
    assert "tokenizer.chat_template" in reader.fields
    if glm.tags is not None:
        tokens = reader.fields["tokenizer.ggml.tokens"].contents()
        kinds = reader.fields["tokenizer.ggml.token_type"].contents()
        want = gguf.TokenType.CONTROL if glm.tags == "special" else gguf.TokenType.USER_DEFINED
        assert {kinds[tokens.index(tag)] for tag in ("<think>", "</think>", "<tool_call>", "<arg_key>")} == {want}
    if glm.architecture == "Glm4MoeForCausalLM":  # GLM-4.5's routing: sigmoid gates, not softmax
        assert reader.fields["glm4moe.expert_gating_func"].contents() == gguf.ExpertGatingFuncType.SIGMOID


def test_chat_completions_split_reasoning_and_stream_the_call(glm):
    client = glm.openai
    reply = client.chat.completions.create(model=MODEL, messages=ASK, temperature=0, max_tokens=100)
    message = reply.choices[0].message
    reasoning = THOUGHT if glm.reasons else None
    assert ((message.model_extra or {}).get("reasoning_content"), message.content) == (reasoning, ANSWER)
    streamed_reasoning, content = "", ""
    for chunk in client.chat.completions.create(model=MODEL, messages=ASK, temperature=0, max_tokens=100, stream=True):
        if chunk.choices:
            streamed_reasoning += (chunk.choices[0].delta.model_extra or {}).get("reasoning_content") or ""
            content += chunk.choices[0].delta.content or ""
    assert (streamed_reasoning or None, content) == (reasoning, ANSWER)

    kw = dict(model=MODEL, messages=ASK, tools=[WEATHER], temperature=0, max_tokens=300)
    whole = client.chat.completions.create(**kw).choices[0]
    assert whole.finish_reason == "tool_calls", whole.message
    assert [(c.function.name, json.loads(c.function.arguments)) for c in whole.message.tool_calls] == [
        ("get_weather", ARGUMENTS)]
    assert (whole.message.model_extra or {}).get("reasoning_content") == (LOOK if glm.reasons else None)
    pieces = [call.function.arguments for chunk in client.chat.completions.create(**kw, stream=True)
              for call in (chunk.choices[0].delta.tool_calls or [] if chunk.choices else []) if call.function.arguments]
    assert "".join(pieces) == whole.message.tool_calls[0].function.arguments
    if glm.reasons:  # the GLM-4.5+ formats stream the arguments as the values come
        assert len(pieces) > 3


def test_messages_give_thinking_text_and_tool_use(glm):
    kw = dict(model=MODEL, max_tokens=2000, messages=ASK, extra_body={"temperature": 0})
    if glm.reasons:
        kw["thinking"] = {"type": "enabled", "budget_tokens": 1024}
    message = glm.anthropic.messages.create(**kw)
    expected = ([("thinking", THOUGHT)] if glm.reasons else []) + [("text", ANSWER)]
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in message.content] == expected
    tool = {"name": "get_weather", "description": "Weather for a city",
            "input_schema": WEATHER["function"]["parameters"]}
    with glm.anthropic.messages.stream(**kw, tools=[tool]) as stream:
        partial = [e.delta.partial_json for e in stream if e.type == "content_block_delta"
                   and e.delta.type == "input_json_delta"]
        final = stream.get_final_message()
    assert json.loads("".join(partial)) == ARGUMENTS
    assert [(b.type, b.name, b.input) for b in final.content if b.type == "tool_use"] == [
        ("tool_use", "get_weather", ARGUMENTS)]
    assert final.stop_reason == "tool_use"


def test_messages_without_thinking_give_the_answer_alone(glm):
    """Anthropic's default is thinking off: no thinking block, and the text is the answer alone.
    The reasoning models here reason although thinking is off (``THINKING_OFF_REPLY``): their
    reasoning is dropped."""
    message = glm.anthropic.messages.create(model=MODEL, max_tokens=100, messages=ASK, extra_body={"temperature": 0})
    assert [(b.type, b.text) for b in message.content] == [("text", ANSWER)]
    if glm.reasons:  # the model did reason: the same prompt on chat completions shows it as reasoning
        reply = glm.openai.chat.completions.create(model=MODEL, messages=ASK, temperature=0, max_tokens=100,
                                                   extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        message = reply.choices[0].message
        assert ((message.model_extra or {}).get("reasoning_content"), message.content) == (THOUGHT, ANSWER)


def test_responses_give_a_reasoning_item_and_a_function_call(glm):
    client = glm.openai
    response = client.responses.create(model=MODEL, input=ASK, temperature=0, max_output_tokens=100)
    assert [item.type for item in response.output] == (["reasoning"] if glm.reasons else []) + ["message"]
    assert response.output_text == ANSWER
    if glm.reasons:
        assert response.output[0].content[0].text == THOUGHT
    tools = [{"type": "function", **WEATHER["function"]}]
    events = list(client.responses.create(model=MODEL, input=ASK, tools=tools, temperature=0, max_output_tokens=300,
                                          stream=True))
    done = [e.item for e in events if e.type == "response.output_item.done" and e.item.type == "function_call"]
    assert [(item.name, json.loads(item.arguments)) for item in done] == [("get_weather", ARGUMENTS)]
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert json.loads("".join(deltas)) == ARGUMENTS


def test_greedy_tokens_equal_transformers_on_an_untrained_prompt(glm):
    """The f32 GGUF decodes as transformers does from the same weights: 24 greedy tokens of a
    prompt the model was not trained on (its end-of-turn tokens ignored), compared by text (the
    reasoning and call tags written, other special tokens not)."""
    import torch
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(glm.folder)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Tell me a story about a cat."}],
                                           add_generation_prompt=True, tokenize=False)
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    model = getattr(transformers, glm.architecture).from_pretrained(glm.folder, dtype=torch.float32).eval()
    with torch.no_grad():
        written = model.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False, eos_token_id=[])
    # the completions API writes the reasoning and call tags as the model wrote them, no other special token
    tags = {tokenizer.convert_tokens_to_ids(t) for t in ("<think>", "</think>", "<tool_call>", "</tool_call>",
                                                         "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>")}
    silent = {i for i, t in tokenizer.added_tokens_decoder.items() if t.special} - tags
    expected = tokenizer.decode([t for t in written[0, len(ids):].tolist() if t not in silent])
    served = glm.openai.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0,
                                           extra_body={"ignore_eos": True})
    assert served.usage.prompt_tokens == len(ids)
    assert served.choices[0].text == expected


def test_a_q8_0_kv_cache_gives_the_trained_answers(glm):
    """``--cache-type-k/-v q8_0`` (half the KV memory): the trained reply and call come out the
    same, reasoning split as at f16."""
    server = RemoteServer("--model", str(glm.gguf), "--served-model-name", MODEL, "--n-ctx", "2048",
                          "--cache-type-k", "q8_0", "--cache-type-v", "q8_0")
    try:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)
        message = client.chat.completions.create(model=MODEL, messages=ASK, temperature=0, max_tokens=100).choices[0].message
        assert ((message.model_extra or {}).get("reasoning_content"), message.content) == (
            THOUGHT if glm.reasons else None, ANSWER)
        call = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], temperature=0,
                                              max_tokens=300).choices[0].message.tool_calls
        assert [(c.function.name, json.loads(c.function.arguments)) for c in call] == [("get_weather", ARGUMENTS)]
        assert "(K q8_0, V q8_0)" in server.log()
    finally:
        server.stop()
