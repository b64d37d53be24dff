"""A tiny tokenizer carrying GLM-4's special tokens (FORMAT.md: the 14 specials after the
ordinary ranks), built in the test with Hugging Face ``tokenizers``: a byte-level BPE with no
merges plus the specials, wrapped in ``PreTrainedTokenizerFast`` with a chat template."""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

GLM4_SPECIALS = ["<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>",
                 "<|assistant|>", "<|observation|>", "<|begin_of_image|>", "<|end_of_image|>",
                 "<|begin_of_video|>", "<|end_of_video|>"]


def glm_tokenizer(chat_template: str) -> PreTrainedTokenizerFast:
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    fast.add_special_tokens({"additional_special_tokens": GLM4_SPECIALS[1:]})
    fast.chat_template = chat_template
    return fast
