"""A tiny tokenizer carrying GLM-4's special tokens (FORMAT.md: the 14 specials after the
ordinary ranks), built in the test with Hugging Face ``tokenizers``: a byte-level BPE over the
256 bytes with a few merges of letter pairs, GLM's pre-tokenizer (the regex of GLM-4.5's
``tokenizer.json``, which llama.cpp knows as ``glm4``), plus the specials, wrapped in
``PreTrainedTokenizerFast`` with a chat template. llama.cpp loads no BPE vocabulary without
merges; merging letters only, the tokens do not depend on how a pre-tokenizer splits words.

GLM-4.5 and later tokenizers also hold their reasoning and tool-call tags (``<think>``,
``<tool_call>``, ``<arg_key>``...) as added tokens, after the 14 (GLM-4.5-Air's
``tokenizer_config.json``); ``tags`` adds them: as ordinary added tokens (``"text"``, which
llama.cpp's converter writes as user-defined tokens, detokenized to their text) or marked
special (``"special"``: control tokens in a GGUF, which llama.cpp detokenizes to nothing, as
some published GLM GGUFs have them)."""

from __future__ import annotations

from typing import Literal

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

GLM4_SPECIALS = ["<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>",
                 "<|assistant|>", "<|observation|>", "<|begin_of_image|>", "<|end_of_image|>",
                 "<|begin_of_video|>", "<|end_of_video|>"]
# GLM-4.5's pre-tokenizer split (tokenizer.json), llama.cpp's LLAMA_VOCAB_PRE_TYPE_GLM4
GLM4_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
              r"\s*[\r\n]+|\s+(?!\S)|\s+")
MERGES = [("t", "h"), ("e", "r"), ("i", "n"), ("a", "n")]
# GLM-4.5's reasoning and tool-call tags, in the order of its added tokens
GLM45_TAGS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
              "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "/nothink"]


def glm_tokenizer(chat_template: str, tags: Literal["text", "special"] | None = None) -> PreTrainedTokenizerFast:
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate([*sorted(alphabet), *(a + b for a, b in MERGES)])}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=MERGES))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(GLM4_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    fast.add_special_tokens({"additional_special_tokens": GLM4_SPECIALS[1:]})
    if tags is not None:
        fast.add_tokens([AddedToken(t, special=tags == "special", normalized=False) for t in GLM45_TAGS],
                        special_tokens=tags == "special")
    fast.chat_template = chat_template
    return fast
