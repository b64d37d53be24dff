"""The transformers engine's parts on their own: the left-padded batch cache, per-request
sampling, incremental detokenization, model resolution and the ``--lora`` flag."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from transformers import DynamicCache  # noqa: E402

from glmserve.engine.transformers.batch import PaddedKVBatch  # noqa: E402
from glmserve.engine.transformers.sampling import Sampler  # noqa: E402
from glmserve.engine.hf_tokenizer import IncrementalDetokenizer  # noqa: E402
from glmserve.engine.types import SamplingParams  # noqa: E402
from glmserve.models import ModelNotFoundError, resolve_hf_model  # noqa: E402
from glmserve.settings.serve import ServeSettings  # noqa: E402


def _cache(length: int, value: float, layers: int = 2) -> DynamicCache:
    cache = DynamicCache()
    for i in range(layers):
        kv = torch.full((1, 2, length, 3), value + i)
        cache.update(kv, kv.clone(), i)
    return cache


def test_padded_batch_aligns_rows_right_and_trims_padding():
    batch = PaddedKVBatch()
    batch.add(_cache(2, 1.0), 2)
    batch.add(_cache(5, 2.0), 5)  # longer: the first row gets 3 columns of left padding
    assert batch.mask.tolist() == [[0, 0, 0, 1, 1], [1, 1, 1, 1, 1]]
    keys = batch.cache.layers[1].keys
    assert keys.shape == (2, 2, 5, 3)
    assert keys[0, :, :3].abs().sum() == 0 and (keys[0, :, 3:] == 2.0).all() and (keys[1] == 3.0).all()
    batch.add(_cache(1, 7.0), 1)  # shorter: padded itself
    assert batch.mask[2].tolist() == [0, 0, 0, 0, 1]
    mask = batch.next_mask()
    assert mask.shape == (3, 6) and mask[:, -1].tolist() == [1, 1, 1]
    for i in range(2):  # what the model's forward does: one more position per row
        kv = torch.full((3, 2, 1, 3), 9.0)
        batch.cache.update(kv, kv.clone(), i)
    batch.advance(mask)
    batch.keep([2, 0])  # the long row leaves: columns padded in both remaining rows go
    assert batch.mask.tolist() == [[0, 1, 1], [1, 1, 1]]
    assert batch.cache.layers[0].keys.shape == (2, 2, 3, 3)
    assert (batch.cache.layers[0].keys[1, :, :2] == 1.0).all() and (batch.cache.layers[0].keys[:, :, 2] == 9.0).all()
    batch.keep([])
    assert len(batch) == 0 and batch.cache is None


def test_greedy_bias_and_penalties():
    logits = torch.tensor([1.0, 3.0, 2.0, 0.5])
    assert Sampler(SamplingParams(max_tokens=1, temperature=0), 4).sample(logits) == 1
    biased = Sampler(SamplingParams(max_tokens=1, temperature=0, logit_bias={1: -100.0, 99: 5.0}), 4)
    assert not biased.plain_greedy and biased.sample(logits) == 2  # out-of-vocabulary ids are ignored
    penalized = Sampler(SamplingParams(max_tokens=1, temperature=0, presence_penalty=1.5), 4)
    penalized.accept(1)
    assert penalized.sample(logits) == 2  # 3.0 - 1.5 < 2.0
    repeated = Sampler(SamplingParams(max_tokens=1, temperature=0, repetition_penalty=2.0), 4)
    repeated.accept(1)
    assert repeated.sample(logits) == 2  # 3.0 / 2 < 2.0
    freq = Sampler(SamplingParams(max_tokens=1, temperature=0, frequency_penalty=0.4), 4)
    freq.accept(1)
    assert freq.sample(logits) == 1  # 3.0 - 0.4 > 2.0
    freq.accept(1)
    freq.accept(1)
    assert freq.sample(logits) == 2  # 3.0 - 1.2 < 2.0
    assert logits.tolist() == [1.0, 3.0, 2.0, 0.5]  # the batch's logits are never modified


def test_seeded_sampling_reproduces_and_filters_apply():
    logits = torch.randn(50, generator=torch.Generator().manual_seed(1))
    draws = lambda seed, **kw: [Sampler(SamplingParams(max_tokens=1, seed=seed, **kw), 50).sample(logits)  # noqa: E731
                                for _ in range(3)]
    assert draws(5) == draws(5)
    sampler = Sampler(SamplingParams(max_tokens=1, seed=3, top_k=2), 50)
    top2 = set(torch.topk(logits, 2).indices.tolist())
    assert {sampler.sample(logits) for _ in range(40)} <= top2
    nucleus = Sampler(SamplingParams(max_tokens=1, seed=3, top_p=0.01), 50)
    assert {nucleus.sample(logits) for _ in range(20)} == {int(logits.argmax())}
    min_p = Sampler(SamplingParams(max_tokens=1, seed=3, min_p=0.99), 50)
    assert {min_p.sample(logits) for _ in range(20)} == {int(logits.argmax())}


class _ByteTokenizer:
    """Each id is one UTF-8 byte; 300 is a special token (no text), ``</think>``."""

    def decode(self, ids, skip_special_tokens=True, clean_up_tokenization_spaces=False):
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def convert_ids_to_tokens(self, token_id):
        return "</think>" if token_id == 300 else bytes([token_id]).decode("latin-1")


def test_detokenizer_holds_split_characters_until_complete():
    detok = IncrementalDetokenizer(_ByteTokenizer(), list(b"ab"))
    out = [detok.feed(i) for i in [*"hé".encode(), 300, *"🙂".encode()]]
    assert out == ["h", "", "é", "", "", "", "", "🙂"]
    detok.feed(0xF0)  # the first byte of a character that never ends
    assert detok.flush() == "\ufffd"


def test_detokenizer_writes_the_special_tokens_it_is_told_to_show():
    """A tag the parsers read (``</think>`` marked special by the vocabulary) is written where it
    stands, a character split around it included; other special tokens still give nothing."""
    tokens = [*"é".encode()[:1], 300, *"é".encode()[1:], *b"ok"]
    split = IncrementalDetokenizer(_ByteTokenizer(), [], frozenset({300}))
    assert "".join(split.feed(i) for i in tokens) + split.flush() == \
        "\ufffd</think>\ufffdok"
    detok = IncrementalDetokenizer(_ByteTokenizer(), list(b"ab"), frozenset({300}))
    assert [detok.feed(i) for i in [*b"hi", 300, *"é".encode(), 301]] == ["h", "i", "</think>", "", "é", ""]
    assert detok.flush() == ""


def test_resolve_hf_model(tmp_path):
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    resolved = resolve_hf_model(str(folder))
    assert (resolved.format, resolved.name, resolved.path) == ("hf", "my-model", folder)
    assert resolve_hf_model(None).format == "gguf"
    with pytest.raises(ModelNotFoundError, match="local Hugging Face cache"):
        resolve_hf_model("no-such-org/no-such-model")


@pytest.mark.parametrize("value", ["noequals", "=path", "a b=path"])
def test_lora_flag_needs_name_equals_path(value):
    with pytest.raises(ValueError, match="NAME=PATH"):
        ServeSettings(lora=[value])


def test_lora_names_are_unique():
    assert ServeSettings(lora=["a=/x", "b=/y"]).lora_adapters() == {"a": __import__("pathlib").Path("/x"),
                                                                    "b": __import__("pathlib").Path("/y")}
    with pytest.raises(ValueError, match="twice"):
        ServeSettings(lora=["a=/x", "a=/y"])
