"""The ``Tokenizer`` protocol over a llama.cpp vocabulary, plus incremental detokenization."""

from __future__ import annotations

import codecs
import ctypes

import llama_cpp
from llama_cpp._internals import LlamaModel

from glmserve.engine.rules import TagEscaper, tag_escaper


class LlamaCppTokenizer:
    """Tokenizer of a loaded GGUF model (thread-safe: the vocabulary is read-only)."""

    def __init__(self, model: LlamaModel) -> None:
        self._model = model
        self._vocab = model.vocab
        self.vocab = model.vocab
        self.n_vocab = model.n_vocab()
        self.bos_id = model.token_bos()
        self.eos_id = model.token_eos()
        self.add_bos = bool(llama_cpp.llama_vocab_get_add_bos(self._vocab))
        # fixed per token: computed once, so the per-token path makes no llama.cpp call for them
        self.eog_ids = frozenset(i for i in range(self.n_vocab) if llama_cpp.llama_vocab_is_eog(self._vocab, i))
        self._pieces: dict[int, bytes] = {}
        self._written: dict[int, bytes] = {}  # decode's pieces (special tokens written out), at most n_vocab
        self._tag_texts: dict[frozenset[int], tuple[str, ...]] = {}
        self._special_texts: frozenset[str] | None = None

    def encode(self, text: str) -> list[int]:
        return self._model.tokenize(text.encode("utf-8"), add_bos=False, special=True) if text else []

    def encode_prompt(self, text: str) -> list[int]:
        ids = self.encode(text)
        if self.add_bos and self.bos_id >= 0 and (not ids or ids[0] != self.bos_id):
            ids.insert(0, self.bos_id)
        return ids

    def special_texts(self) -> frozenset[str]:
        if self._special_texts is None:  # the control tokens
            control = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL
            self._special_texts = frozenset(
                text for i in range(self.n_vocab) if llama_cpp.llama_vocab_get_attr(self._vocab, i) & control
                and (text := self._piece(i, special=True).decode("utf-8", errors="replace")))
        return self._special_texts

    def encode_plain(self, text: str) -> list[int]:
        ids = self._model.tokenize(text.encode("utf-8"), add_bos=False, special=False) if text else []
        user_defined = llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED  # (matched whatever parse_special says)
        if len(text) > 1 and any(llama_cpp.llama_vocab_get_attr(self._vocab, i) & user_defined for i in ids):
            return self.encode_plain(text[0]) + self.encode_plain(text[1:])
        return ids

    def is_special(self, token_id: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_control(self._vocab, token_id)) or token_id in self.eog_ids

    def token_text(self, token_id: int) -> str:
        return self._model.token_get_text(token_id) if token_id >= 0 else ""

    def piece(self, token_id: int, shown: frozenset[int] = frozenset()) -> bytes:
        """The bytes a token stands for; control tokens give ``b""``, but those in ``shown`` (the
        reasoning and call tags of ``GenerationRequest.shown_special_ids``) give their text.
        Cached per token."""
        if token_id in shown:
            return self._piece(token_id, special=True)
        piece = self._pieces.get(token_id)
        if piece is None:
            piece = self._pieces[token_id] = self._piece(token_id)
        return piece

    def decoder(self, escaped: frozenset[int] = frozenset()) -> IncrementalDecoder:
        """An ``IncrementalDecoder`` of one sequence whose text escapes the look-alikes of the tag
        tokens ``escaped`` (``rules.escaped_tags``, ``rules.TagEscaper``)."""
        texts = self._tag_texts.get(escaped)
        if texts is None:
            texts = self._tag_texts[escaped] = tuple(self._piece(i, special=True).decode("utf-8", errors="replace")
                                                     for i in escaped)
        return IncrementalDecoder(tag_escaper(texts))

    def decode(self, token_ids: list[int]) -> str:
        """The text of ``token_ids``, special tokens written out; an id outside the vocabulary (an
        image's media tokens in a prompt, ``vision.media_token``) gives nothing: llama.cpp reads
        out of bounds for it. Pieces are cached per token (a whole prompt, the miss report's,
        without a call per token)."""
        written, n_vocab = self._written, self.n_vocab
        pieces = [written[t] if t in written else written.setdefault(t, self._piece(t, special=True))
                  if 0 <= t < n_vocab else b"" for t in token_ids]
        return b"".join(pieces).decode("utf-8", errors="replace")

    def _piece(self, token_id: int, special: bool = False) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(self._vocab, token_id, buf, len(buf), 0, special)
        if n < 0:  # buffer too small: -n is the size needed
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self._vocab, token_id, buf, len(buf), 0, special)
        return buf.raw[:n]


class IncrementalDecoder:
    """Token pieces (bytes) -> text deltas; a UTF-8 character split across tokens is emitted
    when its last byte arrives; invalid bytes become U+FFFD. With ``escaper``
    (``rules.TagEscaper``), a tag token's piece (``feed(piece, tag=True)``) is written as is and
    the same characters of other tokens escaped."""

    __slots__ = ("_decoder", "_escaper")

    def __init__(self, escaper: TagEscaper | None = None) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._escaper = escaper

    def feed(self, piece: bytes, tag: bool = False) -> str:
        if self._escaper is None:
            return self._decoder.decode(piece, final=False)
        if tag:  # the text held back, all of it, then the tag's own
            return self.flush() + piece.decode("utf-8", errors="replace")
        return self._escaper.feed(self._decoder.decode(piece, final=False))

    def flush(self) -> str:
        text = self._decoder.decode(b"", final=True)
        return text if self._escaper is None else self._escaper.feed(text) + self._escaper.flush()
