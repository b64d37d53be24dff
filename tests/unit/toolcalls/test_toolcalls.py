"""Tool-call parsers, table-driven: whole outputs, and every way of splitting them into stream
deltas (one character at a time, random chunks) gives the same result."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from glmserve.toolcalls import PARSERS, ParsedOutput, ToolCallItem, assemble, detect_parser, output_parser
from glmserve.toolcalls.reasoning import LEAD_CHARS, has_reasoning, prompt_state

WEATHER = {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "units": {"type": "string"},
    "tags": {"type": "array"}}}}
SEARCH = {"name": "search", "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}
BROWSER = {"name": "simple_browser", "parameters": {"type": "object"}}
CLOCK = {"name": "clock", "parameters": {"type": "object", "properties": {}}}
TOOLS = [WEATHER, SEARCH, BROWSER, CLOCK]
# the end of each rendered prompt state: GLM-4.7's generation prompt with thinking on and off,
# GLM-4.5's (the model writes <think> itself)
PROMPTS = {"reasoning": "<|user|>Hi<|assistant|><think>", "answer": "<|user|>Hi<|assistant|></think>",
           "open": "<|user|>Hi<|assistant|>"}


def make_parser(key: str, tools=TOOLS):
    """``key``: a parser name, ``@state`` for the prompt it follows (GLM formats and ``none``, no
    tool parser, come behind the reasoning parser; their default state is ``open``)."""
    name, _, state = key.partition("@")
    reasoning = name in ("glm45", "glm47", "none") or bool(state)
    return output_parser(None if name == "none" else name, tools, reasoning, PROMPTS[state or "open"])


def out(content=None, calls=(), reasoning=None) -> ParsedOutput:
    return ParsedOutput(content, [ToolCallItem(n, a) for n, a in calls], reasoning)


CASES = [
    # --- glm4 -----------------------------------------------------------------------------
    ("glm4", "plain-answer", "\nThe weather in Paris is sunny.", out("The weather in Paris is sunny.")),
    ("glm4", "call", 'get_weather\n{"city": "Beijing"}', out(None, [("get_weather", '{"city": "Beijing"}')])),
    ("glm4", "call-unicode", 'get_weather\n{"city": "北京", "days": 3}',
     out(None, [("get_weather", '{"city": "北京", "days": 3}')])),
    ("glm4", "unknown-name", 'get_time\n{"tz": "UTC"}', out('get_time\n{"tz": "UTC"}')),
    ("glm4", "broken-json", 'get_weather\n{"city": "Bei', out('get_weather\n{"city": "Bei')),
    ("glm4", "array-arguments", 'get_weather\n["x"]', out('get_weather\n["x"]')),
    ("glm4", "name-prefix-then-text", "get the umbrella ready", out("get the umbrella ready")),
    ("glm4", "simple-browser", 'simple_browser\nsearch("北京 天气", recency_days=7)',
     out(None, [("simple_browser", '{"command": "search(\\"北京 天气\\", recency_days=7)"}')])),
    ("glm4", "empty", "", out("")),
    # --- glm45 ----------------------------------------------------------------------------
    ("glm45", "think-and-answer", "\n<think>The user greets.</think>\nHello!", out("Hello!", reasoning="The user greets.")),
    ("glm45", "no-think", "\nHello there!", out("Hello there!")),
    ("glm45", "empty-think", "<think></think>\nHi", out("Hi")),
    ("glm45", "call-typed", "<think>need weather</think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n"
     "<arg_value>Beijing</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>",
     out(None, [("get_weather", '{"city": "Beijing", "days": 3}')], "need weather")),
    ("glm45", "string-that-looks-numeric", "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>123</arg_value>\n"
     "</tool_call>", out(None, [("get_weather", '{"city": "123"}')])),
    ("glm45", "array-value", "<tool_call>get_weather\n<arg_key>tags</arg_key>\n<arg_value>[\"a\", \"ö\"]</arg_value>\n"
     "</tool_call>", out(None, [("get_weather", '{"tags": ["a", "ö"]}')])),
    ("glm45", "two-calls-and-text", "Checking both.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n"
     "<arg_value>Paris</arg_value>\n</tool_call>\n<tool_call>search\n<arg_key>query</arg_key>\n"
     "<arg_value>Louvre hours</arg_value>\n</tool_call>",
     out("Checking both.", [("get_weather", '{"city": "Paris"}'), ("search", '{"query": "Louvre hours"}')])),
    ("glm45", "unknown-function", "<tool_call>launch\n<arg_key>x</arg_key>\n<arg_value>1</arg_value>\n</tool_call>",
     out("<tool_call>launch\n<arg_key>x</arg_key>\n<arg_value>1</arg_value>\n</tool_call>")),
    # once the head (a known name) is out, the text is a call: a key without value tags takes the
    # text up to the next tag, stray text is content, and a call left open is closed at the end
    ("glm45", "key-without-value", "<tool_call>search\n<arg_key>query</arg_key> junk\n</tool_call>",
     out(None, [("search", '{"query": "junk"}')])),
    ("glm47@answer", "key-without-any-value", "<tool_call>get_weather<arg_key>city</arg_key><arg_key>days"
     "</arg_key><arg_value>2</arg_value></tool_call>", out(None, [("get_weather", '{"city": "", "days": 2}')])),
    ("glm45", "stray-text-between-pairs", "<tool_call>get_weather\n<arg_key>city</arg_key><arg_value>Oslo</arg_value>"
     " hmm <arg_key>days</arg_key><arg_value>2</arg_value></tool_call>",
     out("hmm", [("get_weather", '{"city": "Oslo", "days": 2}')])),
    ("glm45", "unclosed-call", "<tool_call>search\n<arg_key>query</arg_key>\n<arg_value>x",
     out(None, [("search", '{"query": "x"}')])),
    ("glm45", "unclosed-typed-value", "<tool_call>get_weather\n<arg_key>days</arg_key>\n<arg_value>3",
     out(None, [("get_weather", '{"days": 3}')])),
    ("glm45", "text-after-the-name", "<tool_call>search now\nplease</tool_call>",
     out("<tool_call>search now\nplease</tool_call>")),
    ("glm45", "string-needs-escaping", '<tool_call>search\n<arg_key>query</arg_key>\n<arg_value>say "hi"\n\\ <b>'
     "</arg_value>\n</tool_call>", out(None, [("search", '{"query": "say \\"hi\\"\\n\\\\ <b>"}')])),
    ("glm45", "tag-like-text-in-a-value", "<tool_call>search\n<arg_key>query</arg_key><arg_value>a </arg_val b"
     "</arg_value></tool_call>", out(None, [("search", '{"query": "a </arg_val b"}')])),
    # malformed calls read as meant where the intent is plain (vLLM issue 49248)
    ("glm47@answer", "missing-arg-value-end-before-call-end", "<tool_call>get_weather<arg_key>city</arg_key>"
     "<arg_value>Rome</tool_call>", out(None, [("get_weather", '{"city": "Rome"}')])),
    ("glm47@answer", "missing-arg-value-end-before-next-key", "<tool_call>get_weather<arg_key>city</arg_key>"
     "<arg_value>Rome<arg_key>days</arg_key><arg_value>2</arg_value></tool_call>",
     out(None, [("get_weather", '{"city": "Rome", "days": 2}')])),
    ("glm47@answer", "missing-typed-value-end", "<tool_call>get_weather<arg_key>days</arg_key><arg_value>4"
     "<arg_key>city</arg_key><arg_value>Rome</arg_value></tool_call>",
     out(None, [("get_weather", '{"days": 4, "city": "Rome"}')])),
    ("glm47@answer", "missing-arg-key-end", "<tool_call>get_weather<arg_key>city<arg_value>Rome</arg_value>"
     "</tool_call>", out(None, [("get_weather", '{"city": "Rome"}')])),
    ("glm47@answer", "missing-arg-key", "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Rome</arg_value>"
     "days</arg_key><arg_value>2</arg_value></tool_call>", out(None, [("get_weather", '{"city": "Rome", "days": 2}')])),
    ("glm45", "missing-first-arg-key", "<tool_call>get_weather\ncity</arg_key>\n<arg_value>Rome</arg_value>\n"
     "</tool_call>", out(None, [("get_weather", '{"city": "Rome"}')])),
    ("glm47@answer", "missing-first-arg-key-one-line", "<tool_call>get_weathercity</arg_key><arg_value>Rome"
     "</arg_value></tool_call>", out(None, [("get_weather", '{"city": "Rome"}')])),
    ("glm47@answer", "missing-first-arg-key-of-an-unknown-name", "<tool_call>get_timecity</arg_key><arg_value>Rome"
     "</arg_value></tool_call>", out("<tool_call>get_timecity</arg_key><arg_value>Rome</arg_value></tool_call>")),
    ("glm47@answer", "missing-arg-value", "<tool_call>get_weather<arg_key>city</arg_key>Rome</arg_value>"
     "</tool_call>", out(None, [("get_weather", '{"city": "Rome"}')])),
    ("glm47@answer", "missing-call-end-at-the-end", "<tool_call>get_weather<arg_key>city</arg_key>"
     "<arg_value>Rome</arg_value>", out(None, [("get_weather", '{"city": "Rome"}')])),
    ("glm47@answer", "missing-call-end-before-the-next-call", "<tool_call>get_weather<arg_key>city</arg_key>"
     "<arg_value>Rome</arg_value><tool_call>clock</tool_call>",
     out(None, [("get_weather", '{"city": "Rome"}'), ("clock", "{}")])),
    ("glm47@answer", "json-arguments-in-tags", '<tool_call>get_weather\n{"city": "Rome", "days": 2}</tool_call>',
     out(None, [("get_weather", '{"city": "Rome", "days": 2}')])),
    ("glm47@answer", "json-arguments-one-line", '<tool_call>get_weather{"city": "Rome"}</tool_call>',
     out(None, [("get_weather", '{"city": "Rome"}')])),
    ("glm47@answer", "json-arguments-not-an-object", '<tool_call>get_weather\n["Rome"]</tool_call>',
     out('<tool_call>get_weather\n["Rome"]</tool_call>')),
    # recovery needs evidence (issue 90): a key read without its <arg_key> is one the schema lists
    ("glm47@answer", "prose-with-a-key-end-tag-is-no-call", "<tool_call>search\nkeys end with</arg_key> like that.",
     out("<tool_call>search\nkeys end with</arg_key> like that.")),
    ("glm47@answer", "an-unlisted-key-without-arg-key-is-content", "<tool_call>get_weather<arg_key>city</arg_key>"
     "<arg_value>Rome</arg_value>so the</arg_key> ends</tool_call>",
     out("so the</arg_key> ends", [("get_weather", '{"city": "Rome"}')])),
    ("glm47@answer", "a-schema-without-properties-takes-any-key", "<tool_call>simple_browser\nurl</arg_key>"
     "<arg_value>x.org</arg_value></tool_call>", out(None, [("simple_browser", '{"url": "x.org"}')])),
    ("glm47@answer", "zero-argument-call-left-open", "<tool_call>clock", out(None, [("clock", "{}")])),
    ("glm47@answer", "a-refused-call-without-its-end-keeps-the-next-call", "<tool_call>nope now"
     "<tool_call>clock</tool_call>", out("<tool_call>nope now", [("clock", "{}")])),
    ("glm47@answer", "json-escapes-in-arguments-are-kept", '<tool_call>get_weather\n{"city": "a\\ue000b"}'
     "</tool_call>", out(None, [("get_weather", '{"city": "a\\ue000b"}')])),
    ("glm47@answer", "json-escapes-in-a-json-value-are-kept", "<tool_call>get_weather<arg_key>tags</arg_key>"
     '<arg_value>["\\ue000"]</arg_value></tool_call>', out(None, [("get_weather", '{"tags": ["\\ue000"]}')])),
    ("glm45", "unclosed-think", "<think>still thinking", out("", reasoning="still thinking")),
    ("glm45", "lt-in-text", "a < b and <tool c", out("a < b and <tool c")),
    ("glm45", "only-think-tag", "<think>", out("")),
    # --- glm47: the prompt opened the reasoning (vLLM #33348), calls on one line ----------------
    ("glm47@reasoning", "prompt-opened-think", "Two plus two makes four.</think>The answer is 4.",
     out("The answer is 4.", reasoning="Two plus two makes four.")),
    ("glm47@reasoning", "thinking-cut-off", "Still going", out("", reasoning="Still going")),
    ("glm47@answer", "thinking-off", "The answer is 4.", out("The answer is 4.")),
    ("glm47@answer", "thinking-off-keeps-think-text", "<think> is a tag", out("<think> is a tag")),
    # a model that reasons although thinking is off: its reasoning is reasoning (the Messages API
    # without thinking drops it), its answer the answer
    ("glm47@answer", "thinking-off-reasons-anyway", "<think>Two and two.</think>The answer is 4.",
     out("The answer is 4.", reasoning="Two and two.")),
    ("glm45@answer", "thinking-off-reasons-anyway", "\n<think>Two and two.</think>\nThe answer is 4.",
     out("The answer is 4.", reasoning="Two and two.")),
    # ... or reasons without opening <think>: a lead closed by </think> is reasoning (issue 90, 7)
    ("glm47@answer", "thinking-off-reasons-without-think", "Two plus two makes four.</think>The answer is 4.",
     out("The answer is 4.", reasoning="Two plus two makes four.")),
    ("glm47@answer", "thinking-off-reasons-without-think-then-calls", "Look it up.</think><tool_call>search"
     "<arg_key>query</arg_key><arg_value>x</arg_value></tool_call>", out(None, [("search", '{"query": "x"}')], "Look it up.")),
    ("glm47@answer", "thinking-off-a-call-before-think-end", "<tool_call>search<arg_key>query</arg_key>"
     "<arg_value>a</think>b</arg_value></tool_call>", out(None, [("search", '{"query": "a</think>b"}')])),
    ("none@answer", "thinking-off-without-tools", "Two.</think>Four.", out("Four.", reasoning="Two.")),
    ("glm47@reasoning", "call-one-line-typed", "need it</think><tool_call>get_weather<arg_key>city</arg_key>"
     "<arg_value>Paris</arg_value><arg_key>days</arg_key><arg_value>5</arg_value><arg_key>tags</arg_key>"
     "<arg_value>[1, true]</arg_value></tool_call>",
     out(None, [("get_weather", '{"city": "Paris", "days": 5, "tags": [1, true]}')], "need it")),
    ("glm47@reasoning", "zero-argument-call", "</think><tool_call>clock</tool_call>",
     out(None, [("clock", "{}")])),
    ("glm47@reasoning", "integer-typed-string-stays-string", "</think><tool_call>get_weather<arg_key>city</arg_key>"
     "<arg_value>5</arg_value></tool_call>", out(None, [("get_weather", '{"city": "5"}')])),
    # a call written inside the reasoning ends it (vLLM #46040): a call, not reasoning
    ("glm47@reasoning", "call-inside-think", "I will look it up.<tool_call>search<arg_key>query</arg_key>"
     "<arg_value>Louvre</arg_value></tool_call>", out(None, [("search", '{"query": "Louvre"}')], "I will look it up.")),
    ("glm47@reasoning", "two-calls-one-line", "</think><tool_call>clock</tool_call><tool_call>search"
     "<arg_key>query</arg_key><arg_value>a</arg_value></tool_call>",
     out(None, [("clock", "{}"), ("search", '{"query": "a"}')])),
    # --- any template with <think> and no tool parser: Qwen3 / DeepSeek-R1 ---------------------
    ("none@reasoning", "qwen3-prompt-opened", "\nplan\n</think>\n\nDone.", out("Done.", reasoning="plan")),
    ("none", "model-opened", "<think>plan</think>Done.", out("Done.", reasoning="plan")),
    ("none", "no-reasoning", "Done <think> later", out("Done <think> later")),
    ("hermes@reasoning", "hermes-call-after-reasoning", 'plan</think>\n<tool_call>\n{"name": "search", '
     '"arguments": {"query": "x"}}\n</tool_call>', out(None, [("search", '{"query": "x"}')], "plan")),
    # --- hermes ---------------------------------------------------------------------------
    ("hermes", "plain", "Paris is the capital.", out("Paris is the capital.")),
    ("hermes", "call", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
     out(None, [("get_weather", '{"city": "Paris"}')])),
    ("hermes", "text-then-two-calls", 'On it.\n<tool_call>\n{"name": "search", "arguments": {"query": "日本"}}\n'
     '</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Tokyo\\"}"}\n</tool_call>',
     out("On it.", [("search", '{"query": "日本"}'), ("get_weather", '{"city": "Tokyo"}')])),
    ("hermes", "unknown-name", '<tool_call>{"name": "nope", "arguments": {}}</tool_call>',
     out('<tool_call>{"name": "nope", "arguments": {}}</tool_call>')),
    ("hermes", "broken-json", '<tool_call>{"name": "search", "arguments": {"query": </tool_call> after',
     out('<tool_call>{"name": "search", "arguments": {"query": </tool_call> after')),
    ("hermes", "unclosed", '<tool_call>{"name": "search"', out('<tool_call>{"name": "search"')),
    ("hermes", "tag-prefix-in-text", "use <tool to fix it", out("use <tool to fix it")),
    # --- generic --------------------------------------------------------------------------
    ("generic", "plain", "Paris is the capital.", out("Paris is the capital.")),
    ("generic", "call", '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}',
     out(None, [("get_weather", '{"city": "Paris"}')])),
    ("generic", "two-calls-loose-spacing", ' {\n "tool_calls":[ {"name": "search", "arguments": {"query": "日本"}},'
     '{"name": "get_weather", "arguments": "{\\"city\\": \\"Tokyo\\"}"} ] }\n',
     out(None, [("search", '{"query": "日本"}'), ("get_weather", '{"city": "Tokyo"}')])),
    ("generic", "braces-in-strings", '{"tool_calls": [{"name": "search", "arguments": {"query": "a } b ] {"}}]}',
     out(None, [("search", '{"query": "a } b ] {"}')])),
    ("generic", "unknown-name", '{"tool_calls": [{"name": "nope", "arguments": {}}]}',
     out('{"name": "nope", "arguments": {}}')),
    ("generic", "other-json", '{"answer": 42}', out('{"answer": 42}')),
    ("generic", "json-prefix-text", '{"tool"} is a word', out('{"tool"} is a word')),
    ("generic", "text-mentioning-json", 'Send {"tool_calls": []} to call.', out('Send {"tool_calls": []} to call.')),
    ("generic", "unclosed-no-call", '{"tool_calls": [{"name": "search"', out('{"tool_calls": [{"name": "search"')),
    ("generic", "empty", "", out("")),
]


def _stream(name: str, deltas: list[str]) -> ParsedOutput:
    parser = make_parser(name)
    events = [e for d in deltas for e in parser.feed(d)] + parser.finish()
    return assemble(events)


@pytest.mark.parametrize(("name", "text", "expected"), [pytest.param(n, t, e, id=f"{n}-{i}") for n, i, t, e in CASES])
def test_whole_output(name, text, expected):
    assert make_parser(name).parse(text) == expected


@pytest.mark.parametrize(("name", "text", "expected"), [pytest.param(n, t, e, id=f"{n}-{i}") for n, i, t, e in CASES])
def test_every_split_gives_the_same_result(name, text, expected):
    assert _stream(name, list(text)) == expected  # one character at a time
    for cut in range(1, len(text)):  # every single split point
        assert _stream(name, [text[:cut], text[cut:]]) == expected
    rng = random.Random(text)
    for _ in range(20):  # random chunkings
        cuts = sorted(rng.sample(range(1, len(text)), k=min(len(text) - 1, rng.randint(1, 8)))) if len(text) > 1 else []
        assert _stream(name, [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)])]) == expected


def test_content_is_released_before_the_end():
    parser = PARSERS["glm4"](TOOLS)
    assert parser.feed("\nThe") and parser.feed(" weather")  # not a tool name: streamed at once
    parser = PARSERS["glm4"](TOOLS)
    assert parser.feed("get_wea") == []  # could still be get_weather
    assert [e.text for e in parser.feed("lth is")] == ["get_wealth is"]
    parser = PARSERS["hermes"](TOOLS)
    assert [e.text for e in parser.feed("Sure <tool")] == ["Sure"]  # the partial tag is held


def test_calls_are_indexed():
    text = ("<tool_call>search\n<arg_key>query</arg_key>\n<arg_value>a</arg_value>\n</tool_call>"
            "<tool_call>search\n<arg_key>query</arg_key>\n<arg_value>b</arg_value>\n</tool_call>")
    parser = PARSERS["glm45"](TOOLS)
    events = parser.feed(text) + parser.finish()
    assert {e.kind for e in events} == {"tool_call"}
    assert [(e.index, e.name) for e in events if e.name] == [(0, "search"), (1, "search")]  # the heads
    assert "".join(e.arguments for e in events if e.index == 1) == '{"query": "b"}'


@pytest.mark.parametrize("name", ["glm45", "glm47"])
def test_glm_arguments_stream_as_the_values_come(name):
    parser = PARSERS[name](TOOLS)
    assert parser.feed("<tool_call>get_wea") == []  # the name is not complete yet
    head = parser.feed("ther<arg_key>ci")
    assert [(e.name, e.arguments) for e in head] == [("get_weather", "")]
    assert [e.arguments for e in parser.feed("ty</arg_key><arg_value>Ber")] == ['{"city": "', "Ber"]
    assert [e.arguments for e in parser.feed("lin</arg_v")] == ["lin"]  # a partial end tag is held
    assert [e.arguments for e in parser.feed("alue><arg_key>days</arg_key><arg_value>1")] == ['"', ', "days": ']
    assert [e.arguments for e in parser.feed("2</arg_value></tool_call>")] == ["12", "}"]  # typed: whole
    assert {e.index for e in head} == {0}


def test_parser_detection_from_templates():
    fixtures = Path(__file__).parents[2] / "fixtures" / "glm"
    assert detect_parser((fixtures / "glm-4.6.jinja").read_text()) == "glm45"
    assert detect_parser((fixtures / "glm-4.7.jinja").read_text()) == "glm47"
    assert detect_parser((fixtures / "glm-4-9b-chat.jinja").read_text()) == "glm4"
    assert detect_parser("{% for m in messages %}<tool_call>{% endfor %}") == "hermes"
    assert detect_parser("{{ messages }}") == "generic"  # no tool format: glmserve's own


# a reply cut by max_tokens inside a call: the call is dropped, never leaked into content;
# complete calls before it are kept. GLM calls stream: one whose head went out stays, with the
# arguments it had (unfinished JSON, as OpenAI's API returns a call cut by max_tokens)
TRUNCATED = [
    ("hermes", '<tool_call>\n{"name": "search", "arguments": {"query": "x"}}\n</tool_call>\n<tool_call>\n{"name": "sea',
     out(None, [("search", '{"query": "x"}')])),
    ("glm45", "Sure.\n<tool_call>search\n<arg_key>query</arg_key>\n<arg_value>Lou</arg_va",
     out("Sure.", [("search", '{"query": "Lou')])),
    ("glm45", "Sure.\n<tool_call>sear", out("Sure.")),
    ("glm47@reasoning", "hm</think><tool_call>search<arg_key>query</arg_key><arg_va", out(None, [("search", "")], "hm")),
    ("glm47@reasoning", "hm</think><tool_call>sea", out("", reasoning="hm")),
    ("glm4", 'get_weather\n{"city": "Bei', out("")),
    ("generic", '{"tool_calls": [{"name": "search", "arguments": {"query": "x"}}, {"name": "get_weather", "argu',
     out(None, [("search", '{"query": "x"}')])),
    ("generic", '{"tool_calls": [{"name": "sea', out("")),
]


@pytest.mark.parametrize(("name", "text", "expected"), TRUNCATED, ids=[f"{t[0]}-{i}" for i, t in enumerate(TRUNCATED)])
def test_a_call_cut_by_max_tokens_is_dropped(name, text, expected):
    for cut in range(1, len(text)):
        parser = make_parser(name)
        assert assemble(parser.feed(text[:cut]) + parser.feed(text[cut:]) + parser.finish(truncated=True)) == expected


def test_generic_calls_stream_as_each_completes():
    parser = PARSERS["generic"](TOOLS)
    assert parser.feed('{"tool_calls": [{"name": "search", "arguments": {"query": "x"}}') != []
    assert parser.feed(', {"name": "search"') == []
    parser = PARSERS["generic"](TOOLS)
    assert [e.text for e in parser.feed("Hello")] == ["Hello"]  # not a call: released at once


def test_prompt_state_from_the_rendered_prompt():
    fixtures = Path(__file__).parents[2] / "fixtures" / "glm"
    from glmserve.chat import ChatTemplate

    glm47 = ChatTemplate((fixtures / "glm-4.7.jinja").read_text())
    ask = [{"role": "user", "content": "2+2?"}]
    assert prompt_state(glm47.render(ask)) == "reasoning"
    assert prompt_state(glm47.render(ask, enable_thinking=False)) == "answer"
    glm46 = ChatTemplate((fixtures / "glm-4.6.jinja").read_text())
    assert prompt_state(glm46.render(ask)) == "open"
    assert prompt_state(glm46.render(ask, enable_thinking=False)) == "answer"
    assert prompt_state("<|im_start|>assistant\n<think>\n") == "reasoning"  # Qwen3 / DeepSeek-R1 distills
    assert has_reasoning(glm47.source) and has_reasoning(glm46.source)
    assert not has_reasoning((fixtures / "glm-4-9b-chat.jinja").read_text())


def test_reasoning_streams_before_the_end_tag():
    parser = make_parser("glm47@reasoning")
    assert [e.text for e in parser.feed("Two plus two</th")] == ["Two plus two"]  # the partial tag is held
    assert [(e.kind, e.text) for e in parser.feed("ink>Four.")] == [("content", "Four.")]


def test_a_think_end_past_the_lead_or_under_a_grammar_is_the_answer_s_text():
    """Thinking off, text before a ``</think>`` is reasoning only where the tag starts within
    ``LEAD_CHARS`` characters, and never where a grammar writes the output: the answer is held
    back at most that far (then it streams) and a grammar's JSON is the answer whatever it holds."""
    lead = "x" * LEAD_CHARS
    assert make_parser("glm47@answer").parse(lead + "</think>y") == out("y", reasoning=lead)
    assert make_parser("glm47@answer").parse(lead + "x</think>y") == out(lead + "x</think>y")
    parser = make_parser("glm47@answer")
    assert parser.feed(lead) == [] and parser.feed("</thi") == []  # the tag may still start in the lead
    assert [e.text for e in parser.feed("s is")] == [lead + "</this is"]  # then the lead is the answer
    assert [e.text for e in parser.feed(" more")] == [" more"]
    json_text = '{"a": "b</think>c"}'
    constrained = output_parser("glm47", TOOLS, True, PROMPTS["answer"], constrained=True)
    assert constrained.parse(json_text) == out(json_text)
    assert make_parser("glm47@answer").parse(json_text) == out('c"}', reasoning='{"a": "b')  # what it guards


def test_calls_cannot_start_inside_reasoning_without_tools():
    # with no tools offered, <tool_call> in the reasoning is just reasoning text
    parser = output_parser(None, [], True, PROMPTS["reasoning"])
    assert parser.parse("maybe <tool_call> then</think>ok") == out("ok", reasoning="maybe <tool_call> then")


def test_tag_texts_are_what_the_parsers_match():
    """The tags a vocabulary may hold as special tokens (``toolcalls.tag_texts``): each is matched
    by the parser it is listed for, so showing it to the parser changes what it reads."""
    from glmserve.toolcalls import tag_texts

    assert tag_texts(None, False) == ()
    assert tag_texts("hermes", False) == ("<tool_call>", "</tool_call>")
    assert set(tag_texts("glm47", True)) == {"<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>",
                                             "</arg_key>", "<arg_value>", "</arg_value>"}
    tools = [{"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}]
    text = "<think>hm</think><tool_call>f<arg_key>a</arg_key><arg_value>1</arg_value></tool_call>"
    parsed = output_parser("glm47", tools, True, "<|assistant|>").parse(text)
    assert (parsed.reasoning_content, [(c.name, c.arguments) for c in parsed.tool_calls]) == ("hm", [("f", '{"a": 1}')])
    # without the tags (a vocabulary's control tokens detokenized to nothing) nothing is parsed
    bare = output_parser("glm47", tools, True, "<|assistant|>").parse("hmfa1")
    assert bare.tool_calls == [] and bare.reasoning_content is None


# one call of get_weather(city="Paris") as a model of each format writes it
_FORMAT_SAMPLES = {
    "glm47": "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>",
    "glm45": "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>",
    "glm4": 'get_weather\n{"city": "Paris"}',
    "hermes": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    "generic": '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}',
}


def test_each_tool_call_format_is_one_registration_whose_grammar_forces_what_its_parser_reads():
    """A format is registered once (``TOOL_FORMATS``): its parser is the one toolcalls.PARSERS
    names, --tool-call-parser's choices are the registered names, and for each the grammar a
    forced call gets admits the call its parser reads back (a format added to PARSERS without
    its registration, its flag choice or a sample here fails)."""
    from typing import get_args

    xgr = pytest.importorskip("xgrammar")
    from xgrammar.testing import _is_grammar_accept_string

    from glmserve.serving.generation.tool_formats import TOOL_FORMATS
    from glmserve.serving.structured.grammar import tool_call_grammar
    from glmserve.serving.structured.schema_check import SchemaLimits
    from glmserve.settings.model import ModelSettings
    from glmserve.toolcalls import PARSERS

    choices = set(get_args(ModelSettings.model_fields["tool_call_parser"].annotation)) - {"auto", "none"}
    assert choices == set(TOOL_FORMATS) == set(_FORMAT_SAMPLES)
    assert {name: f.parser for name, f in TOOL_FORMATS.items()} == PARSERS
    assert all(f.parser.name == name for name, f in TOOL_FORMATS.items())
    weather = {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                     "required": ["city"]}}
    for fmt, text in _FORMAT_SAMPLES.items():
        gbnf = tool_call_grammar(TOOL_FORMATS[fmt].grammar, [weather], ["tools.0"], SchemaLimits())
        assert _is_grammar_accept_string(xgr.Grammar.from_ebnf(gbnf), text), fmt
        parsed = TOOL_FORMATS[fmt].parser([weather]).parse(text)
        assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == [("get_weather", {"city": "Paris"})], fmt
