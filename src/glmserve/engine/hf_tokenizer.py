"""The ``Tokenizer`` protocol over a Hugging Face tokenizer, plus incremental detokenization.

Shared by the engines that serve Hugging Face models (transformers, vllm); needs the
``transformers`` package only for the tokenizer object it is given, not to import.
``HFTokenizer.detokenizer`` gives a ``StreamDetokenizer`` (the ``tokenizers`` library's Rust
``DecodeStream``, as vLLM's ``FastIncrementalDetokenizer``: about 0.7 us a token on SmolLM2's
tokenizer) for a fast tokenizer, an ``IncrementalDetokenizer`` (two Python ``decode`` calls a
token, about 5.5 us) for any other; both give the same text.
"""

from __future__ import annotations

import copy
import threading
from typing import Any

from glmserve.engine.rules import TagEscaper, tag_escaper


class HFTokenizer:
    """glmserve's ``Tokenizer`` over a ``PreTrainedTokenizer(Fast)`` (read-only after load)."""

    def __init__(self, tokenizer: Any, extra_eos_ids: tuple[int, ...] = ()) -> None:
        """``extra_eos_ids``: end-of-generation ids from the model's generation config."""
        self.hf = tokenizer
        self.n_vocab = len(tokenizer)
        self.bos_id = tokenizer.bos_token_id
        self.eos_id = tokenizer.eos_token_id
        self.add_bos = bool(getattr(tokenizer, "add_bos_token", False)) and self.bos_id is not None
        special = set(tokenizer.all_special_ids)
        special.update(i for i, tok in tokenizer.added_tokens_decoder.items() if tok.special)
        self._special = frozenset(special)
        eos = {self.eos_id, *extra_eos_ids} - {None}
        self.eog_ids = frozenset(eos)
        rust = _rust_tokenizer(tokenizer)
        self._backend = rust if rust is not None and _has_decode_stream() else None
        # encoding and decoding call the Rust tokenizer directly where it encodes as the wrapper
        # does (no truncation or padding set): thread-safe without vLLM's pool of tokenizer
        # copies, which deep-copies the tokenizer for each thread that finds the pool empty
        self._rust = rust if rust is not None and rust.truncation is None and rust.padding is None else None
        self._plain, self._plain_lock = None, threading.Lock()  # encode_plain's tokenizer

    def detokenizer(self, prompt_tail: list[int], shown: frozenset[int] = frozenset(),
                    escaped: frozenset[int] = frozenset()) -> IncrementalDetokenizer | TagDetokenizer:
        """An incremental detokenizer of one sequence (see ``IncrementalDetokenizer``); the
        look-alikes of the tag tokens ``escaped`` (of ``shown``: ``rules.escaped_tags``) are
        escaped (``TagDetokenizer``)."""
        if self._backend is not None:
            detok = StreamDetokenizer(self.hf, self._backend, prompt_tail, shown)
        else:
            detok = IncrementalDetokenizer(self.hf, prompt_tail, shown)
        escaper = tag_escaper(self.hf.convert_ids_to_tokens(i) for i in escaped)
        return detok if escaper is None else TagDetokenizer(detok, shown, escaper)

    def encode(self, text: str) -> list[int]:
        """Raises ``UnicodeEncodeError`` for text that is not valid Unicode (a lone surrogate),
        as llama.cpp's tokenizer does; Hugging Face tokenizers raise a bare ``TypeError``."""
        try:
            if not text:
                return []
            if self._rust is not None:
                return self._rust.encode(text, add_special_tokens=False).ids
            return self.hf.encode(text, add_special_tokens=False)
        except TypeError:
            text.encode("utf-8")
            raise

    def encode_prompt(self, text: str) -> list[int]:
        ids = self.encode(text)
        if self.add_bos and (not ids or ids[0] != self.bos_id):
            ids.insert(0, self.bos_id)
        return ids

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special

    def special_texts(self) -> frozenset[str]:
        """The special added tokens' texts."""
        return frozenset(tok.content for tok in self.hf.added_tokens_decoder.values() if tok.special and tok.content)

    def encode_plain(self, text: str) -> list[int]:
        """(Hugging Face's ``split_special_tokens`` sets a flag on the shared Rust tokenizer that
        other threads' ``encode`` would read: a copy of it with the flag set does this, under a
        lock.)"""
        if not text:
            return []
        with self._plain_lock:
            if self._plain is None and self._rust is not None:
                self._plain = copy.deepcopy(self._rust)
                self._plain.encode_special_tokens = True
            if self._plain is not None:
                ids = self._plain.encode(text, add_special_tokens=False).ids
            else:
                ids = self.hf.encode(text, add_special_tokens=False, split_special_tokens=True)
        if len(text) > 1 and any(i in self.hf.added_tokens_decoder for i in ids):  # an added token that is not special
            return self.encode_plain(text[0]) + self.encode_plain(text[1:])
        return ids

    def decode(self, token_ids: list[int]) -> str:
        if self._rust is not None:
            return self._rust.decode(token_ids, skip_special_tokens=False)
        return self.hf.decode(token_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def token_text(self, token_id: int | None) -> str:
        return self.hf.convert_ids_to_tokens(token_id) if token_id is not None else ""


class IncrementalDetokenizer:
    """Token ids -> text deltas, the way vLLM and TGI detokenize streams: decode a short window
    of recent ids and emit what it adds beyond the window's earlier text, holding back output
    that ends in U+FFFD (a character split across byte-level tokens). Special tokens give no
    text, but those in ``shown`` (``GenerationRequest.shown_special_ids``), which give their own.
    ``prompt_tail``: the last prompt ids, so the first token's leading space is right."""

    __slots__ = ("_tok", "_ids", "_prefix", "_read", "_shown")

    def __init__(self, tokenizer: Any, prompt_tail: list[int], shown: frozenset[int] = frozenset()) -> None:
        self._tok = tokenizer
        self._ids = list(prompt_tail)
        self._prefix = 0
        self._read = len(self._ids)
        self._shown = shown

    def _decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def feed(self, token_id: int) -> str:
        if token_id in self._shown:  # what is held back, then the tag's text; the window restarts after it
            text = self.flush() + self._tok.convert_ids_to_tokens(token_id)
            self._ids.append(token_id)
            self._prefix = self._read = len(self._ids)
            return text
        self._ids.append(token_id)
        prefix_text = self._decode(self._ids[self._prefix:self._read])
        text = self._decode(self._ids[self._prefix:])
        if len(text) > len(prefix_text) and not text.endswith("\ufffd"):
            self._prefix, self._read = self._read, len(self._ids)
            return text[len(prefix_text):]
        return ""

    def flush(self) -> str:
        """What is still held back (an incomplete character becomes U+FFFD)."""
        prefix_text = self._decode(self._ids[self._prefix:self._read])
        text = self._decode(self._ids[self._prefix:])
        self._prefix = self._read = len(self._ids)
        return text[len(prefix_text):] if len(text) > len(prefix_text) else ""


class TagDetokenizer:
    """A detokenizer whose tag tokens (``shown``) write their text as is and whose other tokens'
    text goes through ``escaper`` (``rules.TagEscaper``): ``feed``/``flush`` as
    ``IncrementalDetokenizer``'s."""

    __slots__ = ("_inner", "_shown", "_escaper")

    def __init__(self, inner: IncrementalDetokenizer, shown: frozenset[int], escaper: TagEscaper) -> None:
        self._inner, self._shown, self._escaper = inner, shown, escaper

    def feed(self, token_id: int) -> str:
        if token_id in self._shown:  # the text held back, all of it, then the tag's own
            return self.flush() + self._inner.feed(token_id)
        return self._escaper.feed(self._inner.feed(token_id))

    def flush(self) -> str:
        return self._escaper.feed(self._inner.flush()) + self._escaper.flush()


def _rust_tokenizer(tokenizer: Any) -> Any:
    """The ``tokenizers.Tokenizer`` behind a fast Hugging Face tokenizer, else None."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return None
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return backend if isinstance(backend, Tokenizer) else None


def _has_decode_stream() -> bool:
    """Whether the installed ``tokenizers`` has ``DecodeStream`` with prompt ids (0.21 and later)."""
    try:
        from tokenizers.decoders import DecodeStream

        DecodeStream(ids=[], skip_special_tokens=True)
    except (ImportError, TypeError):
        return False
    return True


class StreamDetokenizer(IncrementalDetokenizer):
    """``IncrementalDetokenizer``'s text from the ``tokenizers`` library's ``DecodeStream``
    (which holds back a character split across byte-level tokens, as the window does), primed
    with ``prompt_tail``. ``flush`` and a shown special token decode what the stream holds back
    the window's way; after a shown token the stream starts anew, as the window does. A stream
    that the library finds in an invalid state (non-monotonic UTF-8 output, vLLM issue 17448)
    starts anew at the token, as vLLM's detokenizer does."""

    __slots__ = ("_backend", "_new_stream", "_stream", "_held", "_context")

    def __init__(self, tokenizer: Any, backend: Any, prompt_tail: list[int], shown: frozenset[int] = frozenset()):
        from tokenizers.decoders import DecodeStream

        self._tok, self._backend, self._shown = tokenizer, backend, shown
        self._new_stream = DecodeStream
        tail = list(prompt_tail)
        while tail and self._decode(tail).startswith("\ufffd"):  # a character begun before the tail:
            del tail[0]  # DecodeStream would count its bytes as new text
        self._stream = DecodeStream(ids=tail, skip_special_tokens=True)
        self._context = tail[-4:]  # the last ids whose text went out (for flush)
        self._held: list[int] = []  # ids fed since the last text

    def feed(self, token_id: int) -> str:
        if token_id in self._shown:
            text = self.flush() + self._tok.convert_ids_to_tokens(token_id)
            self._stream, self._context = self._new_stream(skip_special_tokens=True), []
            return text
        try:
            text = self._stream.step(self._backend, token_id)
        except Exception as exc:  # tokenizers raises a plain Exception for the invalid prefix
            if not str(exc).startswith("Invalid prefix encountered"):
                raise
            self._stream = self._new_stream(skip_special_tokens=True)
            text = self._stream.step(self._backend, token_id)
        if text is None:
            self._held.append(token_id)
            return ""
        context = self._context
        if self._held:
            context += self._held
            self._held = []
        context.append(token_id)
        if len(context) > 16:
            del context[:-4]
        return text

    def flush(self) -> str:
        """What the stream holds back (an incomplete character becomes U+FFFD)."""
        if not self._held:
            return ""
        context = self._context[-4:]
        text, prefix_text = self._decode(context + self._held), self._decode(context)
        self._context = context + self._held
        self._held = []
        self._stream = self._new_stream(ids=list(self._context), skip_special_tokens=True)
        return text[len(prefix_text):] if len(text) > len(prefix_text) else ""
