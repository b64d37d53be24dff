"""The web chat page in a real browser (headless Chromium, see ``browser.py``) against the real
server: a question streams its answer; Stop aborts the generation on the server; model output
and imported conversations render inert; conversations survive a reload and export in
``glmserve chat``'s format; regenerate, edit, copy; an adapter picked from ``/v1/models``; the
API-key prompt; a phone-sized screen and the keyboard; images for a vision model.

Each test opens its own browser context (empty localStorage). Screenshots of the main states go
to ``build/screenshots/``."""

from __future__ import annotations

import base64
import json
import re
import time

import httpx
import pytest

from glmserve.models import default_model_path
from tests.conftest import DEFAULT_MODEL, RemoteServer
from tests.e2e.browser import screenshot

pytest.importorskip("playwright")
from playwright.sync_api import expect  # noqa: E402

expect.set_options(timeout=60_000)

SYSTEM = "You are a helpful AI assistant."
QUESTION = "What is the capital of France?"
# runs if any layer lets HTML from a reply through: the sanitizer, then the page's CSP
# (valid CommonMark inline HTML: quoted attribute values, single quotes so JSON leaves them be)
XSS = "<img src='x' onerror='window.__xss=1'><script>window.__xss=2</script>"


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium for this module only: Playwright's sync API runs an asyncio loop on
    the main thread while it is open, and later tests call ``asyncio.run``."""
    from tests.e2e.browser import launch

    yield from launch()


@pytest.fixture(scope="module")
def ui_server():
    server = RemoteServer()
    yield server
    server.stop()


@pytest.fixture
def context(browser):
    ctx = browser.new_context(viewport={"width": 1200, "height": 800})
    yield ctx
    ctx.close()


class Page:
    """A page of the chat UI with what it asked the server (``chat_bodies``) and any uncaught
    script error (``errors``, checked empty at the end of each test)."""

    def __init__(self, context, url: str) -> None:
        self.page = context.new_page()
        self.requests: list = []
        self.errors: list[str] = []
        self.page.on("request", lambda request: self.requests.append(request))
        self.page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        self.url = url
        self.load()

    def load(self) -> None:
        self.page.goto(self.url)
        self.page.wait_for_selector("body.ready")

    def reload(self) -> None:
        self.page.reload()
        self.page.wait_for_selector("body.ready")

    def settings(self, **fields: str) -> None:
        """Fills the settings dialog (``system``, ``temperature``, ``top_p``, ``max_tokens``, ``extra``)."""
        self.page.click("#settings-button")
        for name, value in fields.items():
            self.page.fill(f"#set-{name.replace('_', '-')}", value)
        self.page.click("#settings-save")
        expect(self.page.locator("#settings")).to_be_hidden()

    def ask(self, text: str) -> None:
        self.page.fill("#input", text)
        self.page.press("#input", "Enter")

    def wait_replies(self, count: int) -> None:
        """Until ``count`` finished assistant messages are shown and nothing streams."""
        self.page.wait_for_function(
            "n => document.querySelectorAll('#messages article.msg.assistant:not(.streaming)').length >= n"
            " && document.getElementById('stop').hidden", arg=count, timeout=120_000)

    def chat_bodies(self) -> list[dict]:
        return [r.post_data_json for r in self.requests if r.url.endswith("/v1/chat/completions")]

    def assistant(self, index: int = -1):
        replies = self.page.locator("#messages article.msg.assistant")
        return replies.nth(index) if index >= 0 else replies.last

    def import_conversation(self, data, name: str = "chat.json") -> None:
        self.page.set_input_files("#import-file", files=[
            {"name": name, "mimeType": "application/json", "buffer": json.dumps(data).encode()}])

    def inert(self) -> None:
        """No script ran and no active content is left in the conversation."""
        page = self.page
        page.wait_for_function("() => [...document.querySelectorAll('#messages img')].every(i => i.complete)")
        assert page.evaluate("window.__xss") is None
        active = page.evaluate("""() => [...document.querySelectorAll('#messages *')].filter(e =>
            ['SCRIPT', 'IFRAME', 'OBJECT', 'EMBED', 'FORM'].includes(e.tagName)
            || [...e.attributes].some(a => a.name.startsWith('on') || a.name === 'style'
                                       || /^\\s*javascript:/i.test(a.value))).map(e => e.outerHTML)""")
        assert active == []


def test_question_streams_the_answer_and_survives_a_reload(ui_server, context):
    ui = Page(context, ui_server.url)
    page = ui.page
    expect(page.locator("#model")).to_have_value(DEFAULT_MODEL)
    expect(page.locator("#attach-button")).to_be_hidden()  # no vision
    ui.settings(system=SYSTEM, temperature="0")
    ui.ask(QUESTION)
    ui.wait_replies(1)
    reply = ui.assistant()
    expect(reply.locator(".content")).to_contain_text("Paris")
    expect(reply.locator(".meta")).to_have_text(re.compile(rf"^{DEFAULT_MODEL} · \d+ tokens · [\d.]+ tokens/s$"))
    (body,) = ui.chat_bodies()
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["model"] == DEFAULT_MODEL and body["temperature"] == 0
    assert body["messages"] == [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    screenshot(page, "01-answer")
    # everything the page loaded came from this server (no CDN, no web font)
    assert {r.url.split("/")[2] for r in ui.requests if not r.url.startswith(("data:", "blob:"))} == {
        ui_server.url.split("/")[2]}

    ui.reload()
    expect(page.locator("#conversations li.current .title")).to_have_text(QUESTION)
    expect(page.locator("#messages .system-prompt")).to_contain_text("System prompt")
    expect(ui.assistant().locator(".content")).to_contain_text("Paris")
    page.click("#new-chat")
    expect(page.locator("#messages article.msg")).to_have_count(0)
    page.click("#conversations li .title")
    expect(ui.assistant().locator(".content")).to_contain_text("Paris")
    assert ui.errors == []


def test_stop_aborts_the_generation_on_the_server(ui_server, context):
    ui = Page(context, ui_server.url)
    page = ui.page
    ui.settings(temperature="0", max_tokens="2000", extra='{"ignore_eos": true}')
    aborts_before = ui_server.log().count("aborted after")
    ui.ask("Count to one thousand.")
    streaming = page.locator("#messages article.msg.assistant.streaming .content")
    expect(streaming).to_have_text(re.compile(r"(\S+\s+){8}"))  # words streamed in, the reply still running
    expect(page.locator("#stop")).to_be_visible()
    screenshot(page, "02-streaming")
    page.click("#stop")
    ui.wait_replies(1)
    deadline = time.monotonic() + 30
    while ui_server.log().count("aborted after") == aborts_before and time.monotonic() < deadline:
        time.sleep(0.2)
    log = ui_server.log()
    assert log.count("aborted after") == aborts_before + 1, log[-2000:]
    assert int(log.rsplit("aborted after ", 1)[1].split()[0]) < 2000
    expect(ui.assistant().locator(".meta")).to_contain_text("stopped")
    kept = ui.assistant().locator(".content").inner_text()
    assert len(kept.split()) >= 8
    # the server and the page go on
    ui.settings(max_tokens="8", extra="")
    ui.ask("Hi")
    ui.wait_replies(2)
    expect(ui.assistant().locator(".meta")).to_contain_text("tokens")
    assert ui.chat_bodies()[-1]["max_tokens"] == 8 and "ignore_eos" not in ui.chat_bodies()[-1]
    assert ui.errors == []


def test_streamed_html_in_a_reply_renders_inert(ui_server, context):
    ui = Page(context, ui_server.url)
    # the model is made to write the payload by a JSON schema (sent through "other request fields")
    schema = {"type": "string", "enum": [XSS]}
    ui.settings(extra=json.dumps({"response_format": {"type": "json_schema",
                                                      "json_schema": {"name": "payload", "schema": schema}}}))
    ui.ask("Say something.")
    ui.wait_replies(1)
    reply = ui.assistant().locator(".content")
    expect(reply).to_contain_text('""')  # the JSON string's quotes, the tags between them gone
    expect(reply.locator("img")).to_have_count(1)  # kept, without its handler
    ui.inert()
    screenshot(ui.page, "03-xss-streamed")
    assert ui.errors == []


def _hostile_conversation() -> dict:
    def img(tag: str) -> str:
        return f"<img src='x' onerror='window.__xss=\"{tag}\"'>"

    return {"messages": [
        {"role": "system", "content": img("system")},
        {"role": "user", "content": f"{img('user')} hello"},
        {"role": "assistant", "reasoning_content": img("reasoning"), "content":
            f"Look: {img('md')} [click](javascript:window.__xss='link') "
            "<a href=\"javascript:window.__xss='a'\">a</a> <iframe srcdoc=\"<script>parent.__xss='frame'</script>\">"
            "</iframe> <svg><script>window.__xss='svg'</script></svg> <form action=/x><input name=q></form>"
            "<p style=\"position:fixed;inset:0\">overlay</p>\n\n"
            "```html\n<script>window.__xss='code'</script>\n```"},
        {"role": "user", "content": "next"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": img("tool"), "arguments": json.dumps({"q": img("args")})}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": img("tool-result")},
    ]}


def test_imported_html_renders_inert(ui_server, context):
    ui = Page(context, ui_server.url)
    page = ui.page
    ui.import_conversation(_hostile_conversation())
    expect(page.locator("#messages article.msg")).to_have_count(5)
    # user text is shown as text; a reply's code block shows its code
    expect(page.locator("#messages article.msg.user .content").first).to_have_text(
        "<img src='x' onerror='window.__xss=\"user\"'> hello")
    expect(page.locator("#messages .content pre code")).to_contain_text("<script>window.__xss='code'</script>")
    expect(page.locator("#messages .tool-call .tool-name")).to_have_text(
        "Tool call: <img src='x' onerror='window.__xss=\"tool\"'>")
    for link in page.locator("#messages .content a").all():
        link.click()
    ui.inert()
    screenshot(page, "04-xss-imported")
    assert ui.errors == []


def test_conversations_rename_copy_export_import_delete(ui_server, context):
    context.grant_permissions(["clipboard-read", "clipboard-write"])
    ui = Page(context, ui_server.url)
    page = ui.page
    data = {"messages": [{"role": "system", "content": "Be brief."},
                         {"role": "user", "content": "Show me Python"},
                         {"role": "assistant", "content": "Here:\n\n```python\ndef f(x):\n    return x + 1\n```\n\n| a | b |\n|---|---|\n| 1 | 2 |"}]}
    ui.import_conversation(data, "python.json")
    expect(page.locator("#conversations li.current .title")).to_have_text("Show me Python")
    code = page.locator("#messages pre code.hljs")
    expect(code).to_have_count(1)
    expect(code.locator("span").first).to_be_attached()  # highlighted
    expect(page.locator("#messages table td")).to_have_count(2)
    page.click("#messages pre button.copy")
    assert page.evaluate("navigator.clipboard.readText()") == "def f(x):\n    return x + 1\n"
    screenshot(page, "05-markdown")

    page.click("#conversations li.current button[aria-label^=Rename]")
    page.fill("#conversations input.rename", "Python help")
    page.press("#conversations input.rename", "Enter")
    expect(page.locator("#conversations li.current .title")).to_have_text("Python help")
    expect(page.locator("#title")).to_have_text("Python help")

    with page.expect_download() as download:
        page.click("#export-button")
    assert download.value.suggested_filename == "Python-help.json"
    exported = json.loads(open(download.value.path()).read())
    assert exported == data  # glmserve chat's /save format, as imported

    from glmserve.client.terminal import Conversation

    path = download.value.path()
    loaded = Conversation()
    loaded.load(str(path))
    assert loaded.messages == data["messages"]

    ui.reload()
    expect(page.locator("#conversations li .title")).to_have_text(["Python help"])
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#conversations li.current button[aria-label^=Delete]")
    expect(page.locator("#conversations li")).to_have_count(0)
    ui.reload()
    expect(page.locator("#conversations li")).to_have_count(0)

    ui.import_conversation({"messages": [{"role": "robot", "content": "?"}]}, "bad.json")
    expect(page.locator("#banner")).to_contain_text("Cannot import bad.json: message 0")
    assert ui.errors == []


def test_regenerate_and_edit_the_last_message(ui_server, context):
    ui = Page(context, ui_server.url)
    page = ui.page
    ui.settings(system=SYSTEM, temperature="0", max_tokens="24")
    ui.ask(QUESTION)
    ui.wait_replies(1)
    page.click("#messages article.msg.assistant button.regenerate")
    ui.wait_replies(1)
    expect(page.locator("#messages article.msg.assistant")).to_have_count(1)
    first, again = ui.chat_bodies()
    assert again["messages"] == first["messages"]

    page.click("#messages article.msg.user button.edit")
    page.fill("#messages .editor textarea", "What is the capital of Italy?")
    page.press("#messages .editor textarea", "Enter")
    page.wait_for_function("() => document.querySelectorAll('#messages .editor').length === 0")
    ui.wait_replies(1)
    assert ui.chat_bodies()[-1]["messages"] == [{"role": "system", "content": SYSTEM},
                                                {"role": "user", "content": "What is the capital of Italy?"}]
    expect(page.locator("#messages article.msg")).to_have_count(2)
    expect(page.locator("#messages article.msg.user .content")).to_have_text("What is the capital of Italy?")
    assert ui.errors == []


def test_phone_screen_and_keyboard(ui_server, browser):
    ctx = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
    try:
        ui = Page(ctx, ui_server.url)
        page = ui.page
        expect(page.locator("#new-chat")).not_to_be_in_viewport()
        expect(page.locator("#input")).to_be_in_viewport()
        expect(page.locator("#send")).to_be_in_viewport()
        ui.settings(max_tokens="8")
        page.click("#input")
        page.keyboard.type("line one")
        page.keyboard.press("Shift+Enter")
        page.keyboard.type("line two")
        assert page.input_value("#input") == "line one\nline two"
        expect(page.locator("#messages article.msg")).to_have_count(0)
        page.keyboard.press("Enter")
        ui.wait_replies(1)
        expect(page.locator("#messages article.msg.user .content")).to_have_text("line one\nline two")
        assert page.evaluate("document.documentElement.scrollWidth") <= 390  # nothing wider than the screen
        screenshot(page, "06-phone")
        page.click("#open-sidebar")
        page.wait_for_function("() => document.getElementById('sidebar').getBoundingClientRect().left === 0")
        screenshot(page, "07-phone-sidebar")
        page.click("#conversations li .title")
        expect(page.locator("#new-chat")).not_to_be_in_viewport()
        assert ui.errors == []
    finally:
        ctx.close()


# ---- a LoRA adapter picked from /v1/models ----------------------------------------------------


@pytest.fixture(scope="module")
def adapter_server(gguf_adapter):
    server = RemoteServer("--lora", f"tuned={gguf_adapter}")
    yield server
    server.stop()


def test_adapter_picked_from_the_model_list(adapter_server, context):
    ui = Page(context, adapter_server.url)
    page = ui.page
    options = page.locator("#model option")
    expect(options).to_have_text([DEFAULT_MODEL, f"tuned (LoRA adapter of {DEFAULT_MODEL})"])
    page.select_option("#model", "tuned")
    ui.settings(max_tokens="8")
    ui.ask(QUESTION)
    ui.wait_replies(1)
    assert ui.chat_bodies()[-1]["model"] == "tuned"
    expect(ui.assistant().locator(".meta")).to_have_text(re.compile(r"^tuned · \d+ tokens"))
    ui.reload()
    expect(page.locator("#model")).to_have_value("tuned")
    assert ui.errors == []


@pytest.fixture(scope="module")
def many_server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("models")
    (folder / "alpha.gguf").symlink_to(default_model_path())
    server = RemoteServer("--models-dir", str(folder), "--n-ctx", "1024")
    yield server
    server.stop()


def test_the_model_picker_follows_loads_and_unloads(many_server, context):
    ui = Page(context, many_server.url)
    page = ui.page
    options = page.locator("#model option")
    expect(options).to_have_text([DEFAULT_MODEL, "alpha (unloaded)"])
    assert httpx.post(f"{many_server.url}/models/load", json={"model": "alpha"}, timeout=120).status_code == 200
    expect(options).to_have_text([DEFAULT_MODEL, "alpha"])  # from GET /models/events, no reload
    page.select_option("#model", "alpha")
    ui.settings(max_tokens="8")
    ui.ask(QUESTION)
    ui.wait_replies(1)
    assert ui.chat_bodies()[-1]["model"] == "alpha"
    assert httpx.post(f"{many_server.url}/models/unload", json={"model": "alpha"}, timeout=120).status_code == 200
    expect(options).to_have_text([DEFAULT_MODEL, "alpha (unloaded)"])
    expect(page.locator("#model")).to_have_value("alpha")  # still chosen: the next question loads it
    assert ui.errors == []


# ---- the API key ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def keyed_server():
    server = RemoteServer("--api-key", "sk-browser")
    yield server
    server.stop()


def test_api_key_is_asked_once_and_never_put_in_a_url(keyed_server, context):
    ui = Page(context, keyed_server.url)
    page = ui.page
    dialog = page.locator("#key-dialog")
    expect(dialog).to_be_visible()
    screenshot(page, "08-api-key")
    page.fill("#key-input", "wrong")
    page.click("#key-dialog button[type=submit]")
    expect(page.locator("#key-error")).to_have_text("The server refused this key.")
    expect(dialog).to_be_visible()
    page.fill("#key-input", "sk-browser")
    page.click("#key-dialog button[type=submit]")
    expect(dialog).to_be_hidden()
    expect(page.locator("#model")).to_have_value(DEFAULT_MODEL)
    ui.settings(max_tokens="8")
    ui.ask("Hi")
    ui.wait_replies(1)
    expect(ui.assistant().locator(".meta")).to_contain_text("tokens")
    api_calls = [r for r in ui.requests if "/v1/" in r.url]
    assert {r.headers.get("authorization") for r in api_calls if r.url.endswith("/v1/chat/completions")} == {
        "Bearer sk-browser"}
    assert all("sk-browser" not in r.url and "wrong" not in r.url for r in ui.requests)
    assert page.url.rstrip("/") == keyed_server.url  # the form never navigated
    ui.reload()  # kept in the browser: not asked again
    expect(page.locator("#model")).to_have_value(DEFAULT_MODEL)
    expect(dialog).to_be_hidden()
    # forgetting it asks again
    page.click("#settings-button")
    page.click("#forget-key")
    expect(dialog).to_be_visible()
    assert page.evaluate("localStorage.getItem('glmserve.apiKey')") is None
    assert ui.errors == []


# ---- images for a vision model ----------------------------------------------------------------


@pytest.fixture(scope="module")
def vision_server(smollm2_hf, tmp_path_factory):
    pytest.importorskip("torch")
    from tests.hf_models import tiny_llava

    server = RemoteServer("--engine", "transformers", "--model",
                          str(tiny_llava(smollm2_hf, tmp_path_factory.mktemp("ui-vision") / "tiny-llava")))
    yield server
    server.stop()


def test_image_attached_for_a_vision_model(vision_server, context):
    from tests.image_site import encode

    (card,) = vision_server.client().models.list().data
    assert "vision" in card.model_extra["capabilities"]
    ui = Page(context, vision_server.url)
    page = ui.page
    expect(page.locator("#attach-button")).to_be_visible()
    ui.settings(max_tokens="4")
    page.set_input_files("#attach-file", files=[{"name": "red.png", "mimeType": "image/png",
                                                 "buffer": encode("PNG", size=(40, 30))}])
    expect(page.locator("#attachments img")).to_have_count(1)
    # a pasted image joins it; removed again with its button
    page.evaluate("""b64 => {
        const png = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
        const data = new DataTransfer();
        data.items.add(new File([png], 'pasted.png', { type: 'image/png' }));
        document.getElementById('input').dispatchEvent(new ClipboardEvent('paste', { clipboardData: data, bubbles: true }));
    }""", base64.b64encode(encode("PNG", size=(20, 20))).decode())
    expect(page.locator("#attachments img")).to_have_count(2)
    page.click("#attachments button[aria-label='Remove image 2']")
    expect(page.locator("#attachments img")).to_have_count(1)
    ui.ask("What is in this picture?")
    ui.wait_replies(1)
    content = ui.chat_bodies()[-1]["messages"][-1]["content"]
    assert content[0]["type"] == "image_url" and content[0]["image_url"]["url"].startswith("data:image/png;base64,")
    assert content[1] == {"type": "text", "text": "What is in this picture?"}
    expect(page.locator("#messages article.msg.user img")).to_have_count(1)
    expect(page.locator("#attachments img")).to_have_count(0)
    expect(ui.assistant().locator(".meta")).to_contain_text("tokens")
    expect(page.locator("#messages .error-msg")).to_have_count(0)
    assert ui.errors == []


def test_stream_parser_across_chunk_boundaries(ui_server, context):
    """The page's server-sent-events reader (``api.js``) on a stream cut at every third byte:
    CRLF line ends split between reads, a UTF-8 character split in two, comments, data after
    ``[DONE]`` ignored; an error event raises the server's message."""
    ui = Page(context, ui_server.url)
    result = ui.page.evaluate("""async () => {
        const { sseData } = await import("/ui/api.js");
        const stream = (text) => {
            const bytes = new TextEncoder().encode(text);
            return new ReadableStream({ start(c) {
                for (let i = 0; i < bytes.length; i += 3) c.enqueue(bytes.slice(i, i + 3));
                c.close();
            } });
        };
        const events = [];
        for await (const e of sseData(stream(
            'data: {"a": 1}\\r\\n\\r\\n: ping\\r\\n\\r\\ndata: {"b": "\\u00e9\\u4e2d"}\\n\\n' +
            'event: x\\ndata: {"c":\\ndata: 3}\\n\\ndata: [DONE]\\n\\ndata: {"d": 4}\\n\\n'))) events.push(e);
        let error = null;
        try {
            for await (const e of sseData(stream('data: {"error": {"message": "replica failed", "code": "x"}}\\n\\n'))) events.push(e);
        } catch (err) { error = [err.name, err.message, err.code]; }
        return { events, error };
    }""")
    assert result["events"] == [{"a": 1}, {"b": "é中"}, {"c": 3}]
    assert result["error"] == ["ApiError", "replica failed", "x"]


def _sse(*chunks: dict) -> str:
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "glm-4.5"}
    return "".join(f"data: {json.dumps({**base, **c})}\r\n\r\n" for c in chunks) + "data: [DONE]\r\n\r\n"


def test_reasoning_and_a_streamed_tool_call(ui_server, context):
    """GLM-4.5's reasoning and tool calls as the server streams them (OpenAI's deltas; the
    answer is played back by the browser, as no small model writes them on demand): reasoning
    collapsed above the answer, the call shown as a call, stored in OpenAI's message shape."""
    def delta(**d):
        return {"choices": [{"index": 0, "delta": d, "finish_reason": None}]}

    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ""}}
    body = _sse(delta(role="assistant", content=""), delta(reasoning_content="The user wants "),
                delta(reasoning_content="the weather."), delta(content="Let me check."),
                delta(tool_calls=[call]), delta(tool_calls=[{"index": 0, "function": {"arguments": '{"city": '}}]),
                delta(tool_calls=[{"index": 0, "function": {"arguments": '"Paris"}'}}]),
                {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
                {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 21, "total_tokens": 30}})
    ui = Page(context, ui_server.url)
    page = ui.page
    page.route("**/v1/chat/completions", lambda route: route.fulfill(
        status=200, headers={"content-type": "text/event-stream"}, body=body))
    ui.ask("Weather in Paris?")
    ui.wait_replies(1)
    reply = ui.assistant()
    reasoning = reply.locator("details.reasoning")
    expect(reasoning).to_be_visible()
    assert reasoning.get_attribute("open") is None  # collapsed
    expect(reasoning.locator(".reasoning-text")).to_have_text("The user wants the weather.")
    reasoning.locator("summary").click()
    expect(reasoning.locator(".reasoning-text")).to_be_visible()
    expect(reply.locator(".content")).to_have_text("Let me check.")
    expect(reply.locator(".tool-name")).to_have_text("Tool call: get_weather")
    expect(reply.locator(".tool-call pre")).to_have_text('{\n  "city": "Paris"\n}')
    expect(reply.locator(".meta")).to_have_text(re.compile(r"^glm-4\.5 · 21 tokens"))
    screenshot(page, "09-reasoning-tool-call")
    (stored,) = page.evaluate("JSON.parse(localStorage.getItem('glmserve.conversations'))")
    assert stored["messages"][-1] == {
        "role": "assistant", "content": "Let me check.", "reasoning_content": "The user wants the weather.",
        "tool_calls": [{"id": "call_1", "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}
    assert ui.errors == []


def test_settings_refuse_bad_values(ui_server, context):
    ui = Page(context, ui_server.url)
    page = ui.page
    page.click("#settings-button")
    for field, value, message in (("#set-extra", "{nope", "Other request fields: not JSON"),
                                  ("#set-extra", "[1]", "Other request fields: expected a JSON object")):
        page.fill(field, value)
        page.click("#settings-save")
        expect(page.locator("#settings-error")).to_contain_text(message)
        expect(page.locator("#settings")).to_be_visible()
    # out of range: the browser's own form validation holds the dialog open
    page.fill("#set-extra", "")
    page.fill("#set-temperature", "3")
    page.click("#settings-save")
    expect(page.locator("#settings")).to_be_visible()
    assert page.eval_on_selector("#set-temperature", "e => e.validity.rangeOverflow") is True
    page.click("#settings-cancel")
    assert page.evaluate("localStorage.getItem('glmserve.settings')") is None
    assert ui.errors == []
