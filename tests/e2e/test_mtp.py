"""``--speculative mtp`` on llama_cpp end to end, through the ``openai`` client: a tiny GLM-4.5
with one NextN layer (``tests/hf_models.py`` ``tiny_glm_with_nextn``), converted by llama.cpp's
own converter, drafts from that layer; under ``--batch-invariant`` every greedy answer, plain
and streamed, is the one of the same server without speculation, while drafts are both kept and
rejected (vLLM's spec-decode counters in ``/metrics``). Also: drafts equal a PyTorch NextN layer's,
the MTP benchmark's widened model computes what the model does, and ``--engine vllm`` drafts
from the NextN layer too. A model without NextN layers is refused at start-up
(``tests/e2e/test_startup.py``)."""

from __future__ import annotations

import re
import sys
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.conftest import RemoteServer

MODEL = "glm-mtp"
CODE = ("def total(values, rate):\n    result = 0\n    for value in values:\n        result += value * rate\n"
        "    return result\n")
# 20 prompts: code with renames and numbers, short and past 512 KV cells (the tiny vocabulary
# has a token per character, mostly)
PROMPTS = [
    *(f"Repeat this code, renaming `{old}` to `{new}`:\n\n{CODE * copies}"
      for old, new, copies in [("values", "items", 1), ("total", "acc", 1), ("rate", "k", 6), ("value", "v", 6),
                               ("result", "out", 7), ("total", "sum_", 8)]),
    *(f"Repeat these numbers, adding {k} to each: " + ", ".join(str(n * 37 % 101 + k) for n in range(20 + 20 * k))
      for k in (1, 3, 5, 7, 9)),
    "Count from one to twenty.", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "Hello!", "1 2 3 4 5 6 7 8 9",
    "What is the capital of France?", "the the the the the the", "Write a haiku about autumn.",
    "Name three painters.", "x = [0] * 100",
]


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """``--batch-invariant`` servers of the tiny GLM-4.5 GGUF without and with ``--speculative mtp``."""
    pytest.importorskip("torch")
    from tests.gguf_cache import converted_gguf
    from tests.hf_models import tiny_glm_with_nextn

    root = tmp_path_factory.mktemp("mtp")
    gguf = converted_gguf(tiny_glm_with_nextn(root / MODEL), root / f"{MODEL}.gguf", _converter(), tokenizer_pre="glm4")
    flags = ("--model", str(gguf), "--served-model-name", MODEL, "--n-ctx", "2048", "--max-num-seqs", "2",
             "--batch-invariant")
    base = RemoteServer(*flags)
    spec = RemoteServer(*flags, "--speculative", "mtp")
    yield base, spec, gguf
    base.stop()
    spec.stop()


def _answer(server: RemoteServer, prompt: str, stream: bool) -> tuple[str, int]:
    kwargs = dict(model=MODEL, messages=[{"role": "user", "content": prompt}], temperature=0, max_tokens=64)
    client = server.client()
    if not stream:
        r = client.chat.completions.create(**kwargs)
        return r.choices[0].message.content or "", r.usage.total_tokens
    text, total = [], 0
    for chunk in client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}):
        if chunk.choices:
            text.append(chunk.choices[0].delta.content or "")
        if chunk.usage:
            total = chunk.usage.total_tokens
    return "".join(text), total


def _spec_counters(server: RemoteServer) -> dict[str, float]:
    text = httpx.get(f"{server.url}/metrics").text
    return {name: float(value) for name, value in
            re.findall(r"^glmserve:(spec_decode_\w+)_total\{[^}]*\} (\S+)$", text, re.M)}


def test_the_gguf_carries_the_nextn_layer(servers):
    import gguf

    reader = gguf.GGUFReader(servers[2])
    assert reader.fields["glm4moe.nextn_predict_layers"].contents() == 1
    assert any(t.name == "blk.2.nextn.eh_proj.weight" for t in reader.tensors)


def test_mtp_drafts_never_change_a_greedy_answer(servers):
    base, spec, _ = servers
    past_512 = 0
    for i, prompt in enumerate(PROMPTS):
        stream = i % 4 == 3
        want, total = _answer(base, prompt, stream)
        assert _answer(spec, prompt, stream)[0] == want, prompt
        past_512 += total > 512
    assert past_512 >= 5
    counters = _spec_counters(spec)
    # the NextN layer predicts repeated tokens: drafts were sent, some kept and some rejected
    assert counters["spec_decode_num_drafts"] > 0
    assert 0 < counters["spec_decode_num_accepted_tokens"] < counters["spec_decode_num_draft_tokens"]
    assert not _spec_counters(base)


def _converter() -> Path:
    converter = Path(sys.prefix) / "share" / "llama.cpp" / "convert_hf_to_gguf.py"
    assert converter.is_file(), f"{converter} is missing: run `make install` (it extracts llama.cpp's converter)"
    return converter


def _reference_drafts(folder: Path, prompt: list[int], n: int) -> list[int]:
    """The greedy next token after ``prompt`` and ``n`` drafts after it from GLM-4.5's NextN layer
    in PyTorch, from the folder's weights (``tests/hf_models.py`` ``nextn_forward``): the first
    token paired with zeros, a draft continuing from the layer's own normed output."""
    import torch
    import transformers
    from safetensors.torch import load_file

    from tests.hf_models import NEXTN_KEYS, nextn_forward

    target = transformers.Glm4MoeForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
    layers = target.config.num_hidden_layers
    with_layer = transformers.Glm4MoeForCausalLM.from_pretrained(folder, num_hidden_layers=layers + 1,
                                                                   torch_dtype=torch.float32).eval()
    weights = load_file(folder / "model.safetensors")
    nextn = {k: weights[f"model.layers.{layers}.{k}"] for k in NEXTN_KEYS}
    with torch.no_grad():
        hidden = target.model(input_ids=torch.tensor([prompt])).last_hidden_state[0]
        tokens = [*prompt, int(target.lm_head(hidden[-1]).argmax())]
        states = [torch.zeros_like(hidden[0]), *hidden]  # paired with tokens[0], tokens[1], ...
        for _ in range(n):
            logits, out = nextn_forward(nextn, with_layer.model.layers[layers], with_layer.model.rotary_emb,
                                        target.config.rms_norm_eps, tokens, torch.stack(states))
            tokens.append(int(logits[-1].argmax()))
            states.append(out[-1])
    return tokens[len(prompt):]


def test_drafts_are_the_nextn_layer_of_the_weights(tmp_path, monkeypatch):
    """llama.cpp's MTP context, fed the model's hidden rows as the engine feeds them (a prompt
    decoded in chunks, mirrored), drafts the tokens GLM-4.5's NextN layer computed in PyTorch
    from the same weights gives, for a random NextN layer (every draft kept: ``P_MIN`` 0)."""
    pytest.importorskip("torch")
    import llama_cpp

    from glmserve.engine.llama_cpp import speculative
    from glmserve.engine.llama_cpp.kv.sequence import Chunk, Sequence
    from tests.gguf_cache import converted_gguf
    from tests.hf_models import tiny_glm_with_nextn

    folder = tiny_glm_with_nextn(tmp_path / MODEL, copy=False)
    gguf = converted_gguf(folder, tmp_path / f"{MODEL}.gguf", _converter(), tokenizer_pre="glm4")
    monkeypatch.setattr(speculative, "P_MIN", 0.0)
    with _mtp_decoder(gguf) as (model, ctx, decoder, draft):
        for seed in range(3):
            prompt = [(seed * 31 + i * 7) % 200 + 10 for i in range(20 + seed)]
            want = _reference_drafts(folder, prompt, 4)
            seq = Sequence(f"r{seed}", list(prompt), slot=0)
            decoder.clear_slot(0)
            for start in range(0, len(prompt) - 4, 4):  # in chunks of 4, as a prompt of many steps
                decoder.decode([Chunk(seq, start, 4, False)])
            (_, row), = decoder.decode([Chunk(seq, start + 4, len(prompt) - start - 4, True)])
            logits = llama_cpp.llama_get_logits_ith(ctx, row)
            token = max(range(model.n_vocab()), key=lambda i: logits[i])
            assert [token, *draft.propose(0, [*prompt, token], 4)] == want


def test_an_mtp_state_comes_back_with_its_prompt_from_the_host_cache(tmp_path):
    """A prompt's state saved to the host prompt cache (``--cache-ram``) carries the MTP
    context's cells and the target's last hidden rows: restored into a wiped slot, with its last
    token decoded again (as a restore leaves it), the NextN layer drafts with the same logits as
    before the save (a cleared MTP context would attend to the last token alone)."""
    pytest.importorskip("torch")
    import llama_cpp
    import numpy as np

    from glmserve.engine.llama_cpp.kv.prompt_cache import HostPromptCache
    from glmserve.engine.llama_cpp.kv.sequence import Chunk, KVOp, Sequence
    from tests.gguf_cache import converted_gguf
    from tests.hf_models import tiny_glm_with_nextn

    gguf = converted_gguf(tiny_glm_with_nextn(tmp_path / MODEL, copy=False), tmp_path / f"{MODEL}.gguf",
                          _converter(), tokenizer_pre="glm4")
    host = HostPromptCache(1 << 30)
    prompt = [(i * 7) % 200 + 10 for i in range(40)]
    seq = Sequence("r", list(prompt), slot=0)

    def drafted() -> tuple[list[int], np.ndarray]:
        token = max(range(model.n_vocab()), key=lambda i: logits[i])
        tokens = draft.propose(0, [*prompt, token], 1)
        return tokens, np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(draft._ctx, 0),
                                              shape=(model.n_vocab(),)).copy()

    with _mtp_decoder(gguf) as (model, ctx, decoder, draft):
        for start in range(0, 36, 12):
            decoder.decode([Chunk(seq, start, 12, False)])
        (_, row), = decoder.decode([Chunk(seq, 36, 4, True)])
        logits = llama_cpp.llama_get_logits_ith(ctx, row)
        want, want_logits = drafted()
        decoder.apply([KVOp("save", 0, p1=40, tokens=tuple(prompt))], host)
        assert host.entries[0].draft is not None and host.nbytes > len(host.entries[0].data)
        decoder.clear_slot(0)
        decoder.apply([KVOp("load", 0, entry=host.entries[0]), KVOp("rm", 0, 39)], host)
        (_, row), = decoder.decode([Chunk(seq, 39, 1, True)])
        logits = llama_cpp.llama_get_logits_ith(ctx, row)
        got, got_logits = drafted()
        assert got == want
        np.testing.assert_allclose(got_logits, want_logits, rtol=0, atol=1e-4)


@contextmanager
def _mtp_decoder(gguf: Path):
    """(model, target context, ``BatchDecoder`` of 64 rows, its ``MtpDraft`` follower) of ``gguf``
    loaded with its NextN layers, 256 cells, one sequence; freed after."""
    import llama_cpp
    from llama_cpp._internals import LlamaModel

    from glmserve.engine.llama_cpp.kv.batch import BatchDecoder
    from glmserve.engine.llama_cpp.loading.metadata import model_params
    from glmserve.engine.llama_cpp.params import context_params
    from glmserve.engine.llama_cpp.settings import LlamaCppSettings
    from glmserve.engine.llama_cpp.speculative import mtp

    config = LlamaCppSettings(max_num_seqs=1, max_num_batched_tokens=64)
    params, _ = model_params(gguf, load_mtp=True)
    model = LlamaModel(path_model=str(gguf), params=params, verbose=False)
    ctx = llama_cpp.llama_init_from_model(model.model, context_params(config, 256))
    decoder = BatchDecoder(ctx, 64)
    draft = decoder.follower = mtp.MtpDraft(model, ctx, context_params(config, 256))
    try:
        yield model, ctx, decoder, draft
    finally:
        draft.free()
        decoder.free()
        llama_cpp.llama_free(ctx)
        model.close()


def test_a_widened_model_computes_what_the_model_does(tmp_path):
    """``widened_glm`` (the MTP benchmark's model made as costly as a bandwidth-bound one) keeps
    the model's function: the same logits, and the same NextN drafts, as the model it pads."""
    pytest.importorskip("torch")
    import torch
    import transformers

    from tests.hf_models import tiny_glm_with_nextn, widened_glm

    folder = tiny_glm_with_nextn(tmp_path / MODEL, copy=False)
    wide = widened_glm(folder, tmp_path / "wide", hidden_size=128, intermediate_size=256, moe_intermediate_size=64,
                       leading_layers=2)
    assert transformers.AutoConfig.from_pretrained(wide).num_hidden_layers == 4
    prompt = [(i * 7) % 200 + 10 for i in range(24)]
    logits = []
    for f in (folder, wide):
        model = transformers.Glm4MoeForCausalLM.from_pretrained(f, torch_dtype=torch.float32).eval()
        with torch.no_grad():
            logits.append(model(input_ids=torch.tensor([prompt])).logits[0])
    assert torch.allclose(logits[0], logits[1], atol=1e-4), (logits[0] - logits[1]).abs().max()
    assert _reference_drafts(wide, prompt, 4) == _reference_drafts(folder, prompt, 4)


def test_vllm_drafts_from_the_nextn_layer(tmp_path):
    """``--engine vllm --speculative mtp`` is vLLM's ``method: mtp`` over the checkpoint's NextN
    layer (vLLM's CPU build runs it): on a tiny GLM-4.5 trained to an answer, whose NextN layer
    is trained on it, the answer comes back whole and most drafts are kept."""
    from tests.conftest import vllm_server
    from tests.hf_models import tiny_glm_mtp_trained

    question = [{"role": "user", "content": "Write the function."}]
    folder = tiny_glm_mtp_trained(tmp_path / MODEL, question, CODE)
    srv = vllm_server(folder, "--served-model-name", MODEL, "--speculative", "mtp", "--spec-draft-max", "3")
    try:
        r = srv.client().chat.completions.create(model=MODEL, messages=question, temperature=0, max_tokens=200)
        assert r.choices[0].message.content == CODE.rstrip("\n")
        counters = _spec_counters(srv)
        assert counters["spec_decode_num_drafts"] > 0
        assert counters["spec_decode_num_accepted_tokens"] >= 0.8 * counters["spec_decode_num_draft_tokens"]
    finally:
        srv.stop()
