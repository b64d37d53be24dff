"""Chunks of text written as JSON from a template (``FilledJSON``, ``ChatService.create(
encoded=True)``, what ``/v1/chat/completions`` streams): byte for byte the JSON of the chunk
objects they stand for, for every character and through the real chat pipeline."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from glmserve.chat import ChatTemplate
from glmserve.protocol.chat import ChatCompletionChunk, ChatCompletionRequest, ChunkChoice, DeltaMessage
from glmserve.serving.chat.service import ChatService
from glmserve.serving.generation.chunks import MARK, FilledJSON
from tests.unit.fakes import FakeEngine

GLM47 = (Path(__file__).parents[2] / "fixtures" / "glm" / "glm-4.7.jinja").read_text()
# quotes, backslashes, every kind of line break, control characters, non-ASCII and an emoji
TRICKY = 'say "hi"\\n\n\r\t\x00\x1f\x7f\x85\u2028\u2029 é 中 \U0001F600 </'


def _chunk(delta: DeltaMessage, index: int = 0) -> ChatCompletionChunk:
    return ChatCompletionChunk(id="chatcmpl-1", created=1700000000, model="glm-4.7",
                               choices=[ChunkChoice(index=index, delta=delta)])


@pytest.mark.parametrize("field", ["content", "reasoning_content"])
def test_filled_json_is_the_models_json_for_every_character(field):
    filled = FilledJSON(_chunk(DeltaMessage(**{field: MARK}), index=3))
    code_points = [*range(0xD800), *range(0xE000, 0x110000)]  # every one but the lone surrogates
    for start in range(0, len(code_points), 512):
        text = "".join(map(chr, code_points[start:start + 512]))
        assert filled.fill(text) == _chunk(DeltaMessage(**{field: text}), index=3).model_dump_json(exclude_none=True)
    assert filled.fill("") == _chunk(DeltaMessage(**{field: ""}), index=3).model_dump_json(exclude_none=True)


def test_a_template_must_hold_the_mark_once():
    with pytest.raises(ValueError, match="0 times"):
        FilledJSON(_chunk(DeltaMessage(content="no mark")))
    with pytest.raises(ValueError, match="2 times"):
        FilledJSON(_chunk(DeltaMessage(content=MARK, reasoning_content=MARK)))


async def _collect(service: ChatService, body: dict, encoded: bool) -> list:
    stream = await service.create(ChatCompletionRequest.model_validate(body), encoded=encoded)
    items = [item async for item in stream]
    await stream.aclose()
    return items


def _json(items: list) -> list[str]:
    """Each item's JSON, the random id and the time set aside."""
    dumped = [i if isinstance(i, str) else i.model_dump_json(exclude_none=True) for i in items]
    return [re.sub(r'"created":\d+', '"created":0', re.sub(r'"id":"chatcmpl-[^"]+"', '"id":"x"', i)) for i in dumped]


@pytest.mark.parametrize("extra", [{}, {"n": 2}, {"stream_options": {"include_usage": True}}])
def test_an_encoded_stream_is_the_objects_json(extra):
    """Reasoning, then content, each a chunk per character (the fake engine's tokens), with
    ``n`` choices and a usage chunk: the encoded stream's items are the object stream's JSON,
    and most of them came encoded."""
    engine = FakeEngine(reply=f"{TRICKY}</think>{TRICKY}", context_length=8000)
    service = ChatService(engine, "glm", ChatTemplate(GLM47), "glm47", max_n=2)
    body = {"model": "glm", "messages": [{"role": "user", "content": "Hi"}], "stream": True, **extra}
    plain, encoded = asyncio.run(_collect(service, body, False)), asyncio.run(_collect(service, body, True))
    assert not any(isinstance(i, str) for i in plain)
    assert _json(encoded) == _json(plain)
    # each choice's chunks but its first (the role), its last piece of text (it came with the
    # finish) and its finish, and the usage chunk
    n = extra.get("n", 1)
    assert sum(isinstance(i, str) for i in encoded) == len(encoded) - 3 * n - ("stream_options" in extra)
    strings = [i for i in encoded if isinstance(i, str)]
    assert any('"reasoning_content":"\\u001f' in i for i in strings)  # both kinds, escapes and all
    assert any('"content":"\\n\\r\\t\\u0000"' in i for i in strings)


def test_logprobs_keep_chunks_as_objects():
    service = ChatService(FakeEngine(reply="Hello", context_length=8000), "glm", ChatTemplate(GLM47))
    body = {"model": "glm", "messages": [{"role": "user", "content": "Hi"}], "stream": True, "logprobs": True}
    items = asyncio.run(_collect(service, body, True))
    assert len(items) > 3 and not any(isinstance(i, str) for i in items)
