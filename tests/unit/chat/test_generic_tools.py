"""The generic tool-call format for templates without tools: the grammars it constrains replies
with (checked by xgrammar's matcher, the same engine vLLM and the transformers engine use), the
request planning, and the messages the model sees."""

from __future__ import annotations

import json

import pytest
import xgrammar as xgr

from glmserve.chat.generic import to_generic_messages
from glmserve.chat.messages import to_template_messages
from glmserve.protocol.chat import ChatCompletionRequest
from glmserve.protocol.errors import APIError
from glmserve.serving.structured.grammar import GENERIC_CALLS, MAX_PARALLEL_CALLS, PLAIN_TEXT_GRAMMAR, tool_call_grammar
from glmserve.serving.structured.schema_check import SchemaLimits
from glmserve.serving.generation.tools import plan_tools

WEATHER = {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                 "required": ["city"]}}
TIME = {"name": "get_time", "parameters": {"type": "object", "properties": {"tz": {"type": "string"}},
                                           "required": ["tz"]}}
W = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
T = '{"name": "get_time", "arguments": {"tz": "UTC"}}'
_COMPILER = xgr.GrammarCompiler(xgr.TokenizerInfo(["a"]))


def accepts(gbnf: str, text: str) -> bool:
    matcher = xgr.GrammarMatcher(_COMPILER.compile_grammar(gbnf))
    return matcher.accept_string(text) and matcher.is_completed()


def calls(*items: str) -> str:
    return '{"tool_calls": [' + ", ".join(items) + "]}"


def grammar(mode: str, or_text: bool = False) -> str:
    return tool_call_grammar(GENERIC_CALLS, [WEATHER, TIME], ["a", "b"], SchemaLimits(), mode, or_text=or_text)


def test_distinct_calls_each_function_at_most_once():
    g = grammar("distinct")
    for ok in (calls(W), calls(T), calls(W, T)):
        assert accepts(g, ok), ok
    for bad in (calls(W, W), calls(T, T), calls(), calls(W, T, W), "Paris", calls(W) + " more"):
        assert not accepts(g, bad), bad


def test_one_call_and_any_calls():
    assert accepts(grammar("one"), calls(T)) and not accepts(grammar("one"), calls(W, T))
    g = grammar("any")
    assert accepts(g, calls(W, W, T)) and accepts(g, calls(*[W] * MAX_PARALLEL_CALLS))
    assert not accepts(g, calls(*[W] * (MAX_PARALLEL_CALLS + 1)))  # bounded: no call loop to max_tokens


def test_auto_admits_text_or_calls():
    g = grammar("distinct", or_text=True)
    for ok in ("", "Paris is sunny {today}.", calls(W), calls(W, T)):
        assert accepts(g, ok), ok
    for bad in ('{"answer": 1}', " leading space", calls(W, W), '{"tool_calls": [{"name": "rm"'):
        assert not accepts(g, bad), bad
    assert accepts(PLAIN_TEXT_GRAMMAR, "Hi") and not accepts(PLAIN_TEXT_GRAMMAR, calls(W))


def test_arguments_follow_the_schema():
    g = grammar("one")
    assert not accepts(g, calls('{"name": "get_weather", "arguments": {}}'))  # city is required
    assert not accepts(g, calls('{"name": "get_weather", "arguments": {"city": 3}}'))


def _plan(messages, **kw):
    req = ChatCompletionRequest.model_validate({"model": "m", "messages": messages, "tools": [
        {"type": "function", "function": f} for f in (WEATHER, TIME)], **kw})
    return plan_tools(req, "generic", True, SchemaLimits())


ASK = [{"role": "user", "content": "Weather in Paris?"}]
CALLED = ASK + [{"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}]


def test_auto_is_constrained_and_offers_what_this_turn_has_not_called():
    plan = _plan(ASK)
    assert [f["name"] for f in plan.functions] == ["get_weather", "get_time"] and plan.grammar
    plan = _plan(CALLED)
    assert [f["name"] for f in plan.functions] == ["get_time"]
    assert accepts(plan.grammar, calls(T)) and not accepts(plan.grammar, calls(W))
    both = CALLED[:-1] + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]}]
    plan = _plan(both)
    assert plan.offered is None and plan.grammar == PLAIN_TEXT_GRAMMAR  # all called: answer in text
    plan = _plan(CALLED + [{"role": "user", "content": "And now?"}])  # a new turn: all offered again
    assert len(plan.functions) == 2
    plan = _plan(CALLED, parallel_tool_calls=True)  # the client allows calling a function again
    assert len(plan.functions) == 2 and accepts(plan.grammar, calls(W, W))


def test_required_and_named_plans():
    assert accepts(_plan(ASK, tool_choice="required").grammar, calls(W, T))
    named = _plan(ASK, tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert accepts(named.grammar, calls(T)) and not accepts(named.grammar, calls(W))
    assert not accepts(_plan(ASK, tool_choice="required", parallel_tool_calls=False).grammar, calls(W, T))


def test_auto_with_a_schema_no_grammar_can_enforce_stays_unconstrained():
    odd = {"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "string", "pattern": "a+"}}}}
    req = ChatCompletionRequest.model_validate({"model": "m", "messages": ASK, "tools": [
        {"type": "function", "function": odd}]})
    assert plan_tools(req, "generic", True, SchemaLimits()).grammar is None
    with pytest.raises(APIError):  # but a forced choice needs the grammar: 400
        plan_tools(req.model_copy(update={"tool_choice": "required"}), "generic", True, SchemaLimits())


def test_history_and_tools_become_plain_messages():
    messages = to_template_messages(ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "system", "content": "Be brief."}, *CALLED,
                                    {"role": "tool", "tool_call_id": "call_x", "content": "more"}]}).messages)
    out = to_generic_messages(messages, [WEATHER, TIME], "auto")
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user"]
    assert out[0]["content"].startswith("Be brief.\n\n") and json.dumps(WEATHER) in out[0]["content"]
    assert json.loads(out[2]["content"]) == {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}
    lines = [json.loads(line) for line in out[3]["content"].splitlines()]  # consecutive results: one user turn
    assert lines == [{"tool_response": {"name": "get_weather", "content": "18 C"}},
                     {"tool_response": {"name": "", "content": "more"}}]
    assert to_generic_messages(messages[1:], None, "none")[0]["role"] == "user"  # no tools: no system prompt


def test_json_strings_admit_no_raw_control_characters():
    from glmserve.serving.structured.grammar import json_grammar

    g = json_grammar({"type": "object"}, "response_format", SchemaLimits())
    assert accepts(g, '{"a": "x\\ny"}') and not accepts(g, '{"a": "x\ny"}')
