"""``HFTokenizer``: encoding and decoding through the Rust tokenizer give what the Hugging Face
wrapper gives (which it is bypassed for: vLLM's wrapper deep-copies the tokenizer per thread),
and a tokenizer with truncation set stays with the wrapper. ``HFTokenizer.detokenizer``: over a fast tokenizer, the ``tokenizers`` library's
``DecodeStream`` (``StreamDetokenizer``) gives, token for token, the text of the window
detokenizer (``IncrementalDetokenizer``, two ``decode`` calls a token) it replaces: characters
split across byte-level tokens held back until whole, special tokens silent but those shown
(GLM's ``</think>`` marked special), a prompt tail that begins inside a character, random ids
and an unfinished character at the end (U+FFFD on ``flush``). The tokenizer is GLM's byte-level
BPE of ``tests/unit/glm_tokenizer.py``."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from glmserve.engine.hf_tokenizer import (  # noqa: E402
    HFTokenizer,
    IncrementalDetokenizer,
    StreamDetokenizer,
    TagDetokenizer,
)
from glmserve.engine.rules import TagEscaper, unescape_tags  # noqa: E402
from tests.unit.glm_tokenizer import glm_tokenizer  # noqa: E402

TEXTS = ["Hello wörld, 你好 🙂 the rain in Spain", "emoji 🎉🎉 and ünïcödé", "日本語のテキスト", "plain ascii text here\n\n",
         "  tabs\tand spaces  ", "party 🎉"]


@pytest.fixture(scope="module")
def tok():
    return glm_tokenizer("{{ messages }}", tags="special")


def _outputs(detok, ids: list[int]) -> list[str]:
    return [detok.feed(i) for i in ids] + [detok.flush()]


def _cases(tok, count: int):
    """(prompt tail, generated ids): prompts of whole texts (some ending in ``<|assistant|>``),
    replies of text with shown and silent special tokens put in, or of random ids."""
    rng = random.Random(7)
    think, user, assistant = (tok.convert_tokens_to_ids(t) for t in ("</think>", "<|user|>", "<|assistant|>"))
    for i in range(count):
        prompt = tok.encode(rng.choice(TEXTS), add_special_tokens=False) + ([assistant] if i % 4 == 0 else [])
        if i % 2:
            reply = tok.encode(rng.choice(TEXTS) + rng.choice(TEXTS), add_special_tokens=False)
            for _ in range(rng.randrange(3)):
                reply.insert(rng.randrange(len(reply) + 1), rng.choice([think, user]))
            reply = reply[:rng.randrange(1, len(reply) + 1)]  # cut anywhere: inside a character too
        else:
            reply = [rng.randrange(len(tok)) for _ in range(rng.randrange(1, 24))]
        yield prompt[-4:], reply


def test_a_fast_tokenizer_streams_and_another_uses_the_window(tok):
    assert type(HFTokenizer(tok).detokenizer([])) is StreamDetokenizer

    class Slow:  # no backend_tokenizer: a Python tokenizer
        def __getattr__(self, name):
            return getattr(tok, name)

        def __len__(self):
            return len(tok)

        backend_tokenizer = None

    assert type(HFTokenizer(Slow()).detokenizer([])) is IncrementalDetokenizer


def test_the_stream_gives_the_window_text_token_for_token(tok):
    shown = frozenset({tok.convert_tokens_to_ids("</think>")})
    fast = HFTokenizer(tok)
    starts_inside = 0
    for tail, reply in _cases(tok, 1500):
        starts_inside += tok.decode(tail).startswith("\ufffd")
        want = _outputs(TagDetokenizer(IncrementalDetokenizer(tok, tail, shown), shown, TagEscaper(["</think>"])), reply)
        assert _outputs(fast.detokenizer(tail, shown, shown), reply) == want, (tail, reply)
    assert starts_inside > 0  # prompt tails that begin inside a character were among them


def test_the_stream_text_is_the_decoded_reply(tok):
    text = "".join(TEXTS)
    ids = tok.encode(text, add_special_tokens=False)
    detok = HFTokenizer(tok).detokenizer([])
    assert "".join(_outputs(detok, ids)) == text


def test_a_tag_token_is_a_tag_and_its_look_alike_text(tok):
    """``</think>`` written by its token is the tag; the same characters written by other
    tokens are escaped (the parsers read them as text) and unescaped as the model wrote them."""
    think = tok.convert_tokens_to_ids("</think>")
    spelled = tok.encode("<", add_special_tokens=False) + tok.encode("/think>", add_special_tokens=False)
    ids = tok.encode("x", add_special_tokens=False) + spelled + [think] + spelled[:1] + [think] + spelled
    for detok in (HFTokenizer(tok).detokenizer([], frozenset({think}), frozenset({think})),
                  TagDetokenizer(IncrementalDetokenizer(tok, [], frozenset({think})), frozenset({think}),
                                 TagEscaper(["</think>"]))):
        text = "".join(_outputs(detok, ids))
        assert text.count("</think>") == 2  # the two tokens
        assert unescape_tags(text) == "x</think></think><</think></think>"


def test_encode_and_decode_through_rust_equal_the_wrapper(tok):
    hf = HFTokenizer(tok)
    assert hf._rust is tok.backend_tokenizer
    text = "[gMASK]<sop><|user|>\n" + "".join(TEXTS) + "<|assistant|>\n</think>"
    ids = hf.encode(text)
    assert ids == tok.encode(text, add_special_tokens=False)
    assert hf.decode(ids) == tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False) == text
    assert hf.encode("") == []
    with pytest.raises(UnicodeEncodeError):
        hf.encode("a\ud800b")


def test_a_tokenizer_that_truncates_stays_with_the_wrapper():
    tok = glm_tokenizer("{{ messages }}")
    tok.backend_tokenizer.enable_truncation(4)
    hf = HFTokenizer(tok)
    assert hf._rust is None
    assert len(hf.encode("".join(TEXTS))) > 4  # the wrapper encodes without truncation
