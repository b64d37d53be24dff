"""Preserved thinking measured on a real prefix cache (vLLM's): an agent's three-call tool chain
with reasoning, then a user reply, sent turn by turn to ``/v1/messages`` on GLM-4.7's template.
Each request reads the previous request's whole prompt from the cache, the user reply's too;
the same conversation on ``/v1/chat/completions`` with GLM-4.7's own default (``clear_thinking``
true) re-renders the chain at the user reply and misses from its first turn."""

from __future__ import annotations

import anthropic
import pytest

from tests.conftest import vllm_server

pytest.importorskip("vllm")

TOOL = {"name": "get_weather", "description": "Weather of a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
CITIES = ["Paris", "Rome", "Oslo"]
# an agent-sized system prompt (about 6k tokens of this byte-level tokenizer): vLLM caches whole
# blocks (128 tokens on this CPU), so on a short prompt a block's rounding alone is over 5%
SYSTEM = "\n".join(f"Rule {i}: answer briefly, use the tools when a fact is needed, and never guess a "
                    f"weather report." for i in range(60))


def _chain() -> list[list[dict]]:
    """The conversation before each request: the question, then per city the assistant's
    reasoning and call and its result, then the answer and the user's reply."""
    history = [{"role": "user", "content": "What is the weather in Paris, Rome and Oslo today?"}]
    states = [list(history)]
    for i, city in enumerate(CITIES):
        history += [{"role": "assistant", "content": [
            {"type": "thinking", "thinking": f"I still need the weather in {city}; the tool gives it.", "signature": ""},
            {"type": "tool_use", "id": f"toolu_{i}", "name": "get_weather", "input": {"city": city}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{i}",
                                          "content": f"{city}: sunny, 20 degrees."}]}]
        states.append(list(history))
    history += [{"role": "assistant", "content": [
        {"type": "thinking", "thinking": "All three are known; sum them up.", "signature": ""},
        {"type": "text", "text": "Sunny everywhere, about 20 degrees."}]},
        {"role": "user", "content": "Thanks! Should I take an umbrella to Oslo?"}]
    states.append(history)
    return states


def _to_chat(history: list[dict]) -> list[dict]:
    """The same conversation as chat messages (reasoning_content, tool_calls, tool messages)."""
    import json

    out = [{"role": "system", "content": SYSTEM}]
    for m in history:
        if isinstance(m["content"], str):
            out.append(dict(m))
        elif m["role"] == "assistant":
            blocks = {b["type"]: b for b in m["content"]}
            msg = {"role": "assistant", "content": blocks.get("text", {}).get("text", ""),
                   "reasoning_content": blocks["thinking"]["thinking"]}
            if "tool_use" in blocks:
                use = blocks["tool_use"]
                msg["tool_calls"] = [{"id": use["id"], "type": "function", "function": {
                    "name": use["name"], "arguments": json.dumps(use["input"])}}]
            out.append(msg)
        else:
            out += [{"role": "tool", "tool_call_id": b["tool_use_id"], "content": b["content"]} for b in m["content"]]
    return out


def test_the_user_reply_reads_the_whole_chain_from_the_cache(tmp_path):
    from tests.hf_models import tiny_glm4

    folder = tiny_glm4(tmp_path / "tiny-glm47", "Glm4MoeForCausalLM", "glm-4.7.jinja", context=16384)
    srv = vllm_server(folder, "--served-model-name", "tiny-glm47")
    try:
        client = anthropic.Anthropic(base_url=srv.url, api_key="unused", max_retries=0, timeout=300)
        prompts, cached = [], []
        for history in _chain():
            usage = client.messages.create(model="tiny-glm47", max_tokens=1, system=SYSTEM, messages=history,
                                           tools=[TOOL], thinking={"type": "adaptive"}).usage
            prompts.append(usage.input_tokens + usage.cache_read_input_tokens)
            cached.append(usage.cache_read_input_tokens)
        shares = [c / p for c, p in zip(cached[1:], prompts)]
        print(f"prompt tokens per request {prompts}, read from the prefix cache {cached}, "
              f"share of the previous prompt {[round(s, 3) for s in shares]}")
        assert min(shares) >= 0.95, (prompts, cached)

        # GLM-4.7's default on the chat route: the user reply re-renders the chain's reasoning
        openai_client = srv.client()
        tools = [{"type": "function", "function": {"name": TOOL["name"], "description": TOOL["description"],
                                                   "parameters": TOOL["input_schema"]}}]
        before, reply = (_to_chat(h) for h in _chain()[-2:])
        first = openai_client.chat.completions.create(model="tiny-glm47", max_tokens=1, messages=before, tools=tools)
        second = openai_client.chat.completions.create(model="tiny-glm47", max_tokens=1, messages=reply, tools=tools)
        hit = second.usage.prompt_tokens_details.cached_tokens
        print(f"clear_thinking true: {hit} of the previous {first.usage.prompt_tokens} prompt tokens read from "
              f"the cache ({hit / first.usage.prompt_tokens:.3f}); the chain starts at token {prompts[0]}")
        assert first.usage.prompt_tokens == prompts[-2]  # the same prompt as the Messages route's
        assert hit <= prompts[0]  # missed from the chain's first assistant turn on
    finally:
        srv.stop()
