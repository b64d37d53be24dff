"""GLM-4.1V / 4.6V images on llama_cpp through libmtmd, end to end: a tiny random GLM4V
(``tests/hf_models.py`` ``tiny_glm4v``) converted by llama.cpp's own converter into a text GGUF
and its projector (``mmproj-*.gguf``, found beside it). Greedy answers through the server, with
prompts cut into 16-token chunks around the image and batched with other requests, equal
llama.cpp's own multimodal path (``mtmd_helper_eval_chunks`` then one token at a time, as
``llama-mtmd-cli``); different images give different answers on chat, messages and responses;
an image to the same model without its projector is a 400."""

from __future__ import annotations

import base64
import ctypes
import io
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest

from tests.conftest import RemoteServer

pytest.importorskip("torch")

MODEL = "tiny-glm4v"
MAX_TOKENS = 8
COLORS = [(200, 30, 30), (30, 30, 200), (20, 160, 40)]
SIZES = [(224, 224), (300, 180), (140, 260)]  # merged patches 8 x 8, 10 x 6 (and so on): positions != tokens


def _png(color, size) -> bytes:
    from PIL import Image, ImageDraw

    image = Image.new("RGB", size, color)
    ImageDraw.Draw(image).rectangle((10, 10, size[0] // 2, size[1] // 3), fill=(255, 255, 255))
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return buf.getvalue()


def _url(i: int) -> str:
    return "data:image/png;base64," + base64.b64encode(_png(COLORS[i], SIZES[i])).decode()


def _converter() -> Path:
    converter = Path(sys.prefix) / "share" / "llama.cpp" / "convert_hf_to_gguf.py"
    assert converter.is_file(), f"{converter} is missing: run `make install` (it extracts llama.cpp's converter)"
    return converter


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from tests.gguf_cache import converted_gguf
    from tests.hf_models import tiny_glm4v

    root = tmp_path_factory.mktemp("glm4v")
    folder = tiny_glm4v(root / "hf")
    gguf = converted_gguf(folder, root / "gguf" / f"{MODEL}.gguf", _converter(), tokenizer_pre="glm4")
    converted_gguf(folder, root / "gguf" / f"mmproj-{MODEL}.gguf", _converter(), tokenizer_pre="glm4", mmproj=True)
    return folder, gguf


@pytest.fixture(scope="module")
def server(model):
    srv = RemoteServer("--model", str(model[1]), "--served-model-name", MODEL, "--max-num-batched-tokens", "16",
                       "--max-num-seqs", "3", "--n-ctx", "1024", "--batch-invariant")
    yield srv
    srv.stop()


def _messages(i: int | None, text: str = "What is in this picture?") -> list[dict]:
    image = [] if i is None else [{"type": "image_url", "image_url": {"url": _url(i)}}]
    return [{"role": "user", "content": [{"type": "text", "text": text}, *image]}]


def _chat(server: RemoteServer, i: int | None) -> list[tuple[str, float]]:
    """The greedy answer to ``_messages(i)``: each token's text and log-probability."""
    r = server.client().chat.completions.create(model=MODEL, messages=_messages(i), temperature=0,
                                                max_tokens=MAX_TOKENS, logprobs=True)
    return [(t.token, t.logprob) for t in r.choices[0].logprobs.content]


def _reference(folder: Path, gguf: Path, i: int) -> list[tuple[str, float]]:
    """The greedy tokens (text and log-probability) llama.cpp's own multimodal path gives for
    the chat prompt of ``_messages(i)``, rendered by the model's template."""
    import math

    import llama_cpp
    import llama_cpp.mtmd_cpp as mtmd
    import transformers
    from llama_cpp._internals import LlamaModel
    from PIL import Image

    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    text = tokenizer.apply_chat_template([{"role": "user", "content": [
        {"type": "text", "text": "What is in this picture?"}, {"type": "image"}]}], add_generation_prompt=True,
        tokenize=False).replace("<|begin_of_image|><|image|><|end_of_image|>", mtmd.mtmd_default_marker().decode())
    llm = LlamaModel(path_model=str(gguf), params=llama_cpp.llama_model_default_params(), verbose=False)
    params = llama_cpp.llama_context_default_params()
    # as --batch-invariant computes: flash attention, every decode under 64 rows
    params.n_ctx, params.n_batch, params.n_ubatch, params.n_threads, params.n_threads_batch = 1024, 32, 32, 1, 2
    params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
    ctx = llama_cpp.llama_init_from_model(llm.model, params)
    mparams = mtmd.mtmd_context_params_default()
    mparams.use_gpu, mparams.n_threads, mparams.warmup = False, 2, False
    mctx = mtmd.mtmd_init_from_file(str(gguf.parent / f"mmproj-{MODEL}.gguf").encode(), llm.model, mparams)
    image = Image.open(io.BytesIO(_png(COLORS[i], SIZES[i]))).convert("RGB")
    pixels = image.tobytes()
    bitmap = mtmd.mtmd_bitmap_init(image.width, image.height, (ctypes.c_uint8 * len(pixels)).from_buffer_copy(pixels))
    chunks = mtmd.mtmd_input_chunks_init()
    batch = llama_cpp.llama_batch_init(1, 0, 1)
    try:
        data = text.encode()
        part = mtmd.mtmd_input_text(data, len(data), False, True)
        assert mtmd.mtmd_tokenize(mctx, chunks, ctypes.byref(part), (mtmd.mtmd_bitmap_p_ctypes * 1)(bitmap), 1) == 0
        n_past = llama_cpp.llama_pos(0)
        assert mtmd.mtmd_helper_eval_chunks(mctx, ctx, chunks, 0, 0, 32, True, ctypes.byref(n_past)) == 0
        vocab, pieces, pos = llama_cpp.llama_model_get_vocab(llm.model), [], n_past.value
        for _ in range(MAX_TOKENS):
            logits = llama_cpp.llama_get_logits_ith(ctx, -1)
            row = [logits[t] for t in range(llm.n_vocab())]
            token = max(range(len(row)), key=row.__getitem__)
            buf = ctypes.create_string_buffer(64)
            n = llama_cpp.llama_token_to_piece(vocab, token, buf, 64, 0, True)
            pieces.append((buf.raw[:n].decode(errors="replace"),
                           row[token] - max(row) - math.log(sum(math.exp(x - max(row)) for x in row))))
            batch.n_tokens, batch.token[0], batch.pos[0], batch.n_seq_id[0] = 1, token, pos, 1
            batch.seq_id[0][0], batch.logits[0] = 0, 1
            assert llama_cpp.llama_decode(ctx, batch) == 0
            pos += 1
        return pieces
    finally:
        llama_cpp.llama_batch_free(batch)
        mtmd.mtmd_input_chunks_free(chunks)
        mtmd.mtmd_bitmap_free(bitmap)
        mtmd.mtmd_free(mctx)
        llama_cpp.llama_free(ctx)
        llm.close()


def test_batched_chunked_answers_equal_llama_cpp_own_multimodal_path(server, model):
    """Three image requests and a text request at once, prompts in 16-token chunks (one chunk
    runs through each image): each image's greedy answer is llama.cpp's own."""
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda i: _chat(server, i), [0, 1, 2, None]))
    for i in range(3):
        want = _reference(*model, i)
        assert [t for t, _ in answers[i]] == [t for t, _ in want], i
        # batched with other sequences, llama.cpp's rows move by up to 6e-4 even under
        # --batch-invariant (the top two logits of these answers are 0.12 or more apart)
        assert [lp for _, lp in answers[i]] == pytest.approx([lp for _, lp in want], abs=5e-3), i
    assert len({tuple(t for t, _ in a) for a in answers}) == 4  # each image (and none) gives its own answer


def test_images_change_the_answer_on_chat_messages_and_responses(server):
    import anthropic

    client = server.client()
    chat = [client.chat.completions.create(model=MODEL, messages=_messages(i), temperature=0,
                                           max_tokens=MAX_TOKENS).choices[0].message.content for i in (0, 1, 0)]
    assert chat[0] == chat[2] != chat[1]
    messages = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=120)
    answers = []
    for i in (0, 1):
        data = base64.b64encode(_png(COLORS[i], SIZES[i])).decode()
        r = messages.messages.create(model=MODEL, max_tokens=MAX_TOKENS, extra_body={"temperature": 0}, messages=[{
            "role": "user", "content": [{"type": "text", "text": "What is in this picture?"},
                                        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                     "data": data}}]}])
        assert r.usage.input_tokens + r.usage.cache_read_input_tokens > 60  # the image's tokens count (cached or not)
        answers.append("".join(b.text for b in r.content if b.type == "text"))
    assert answers[0] != answers[1]
    responses = [client.responses.create(model=MODEL, temperature=0, max_output_tokens=MAX_TOKENS, input=[{
        "role": "user", "content": [{"type": "input_text", "text": "What is in this picture?"},
                                    {"type": "input_image", "image_url": _url(i)}]}]).output_text for i in (0, 1)]
    assert responses[0] != responses[1]


def test_image_tokens_count_in_usage(server):
    client = server.client()
    usage = [client.chat.completions.create(model=MODEL, messages=_messages(i), temperature=0, max_tokens=1).usage
             for i in (None, 0, 1)]
    # 224 x 224 px: 16 x 16 patches of 14 px, merged 2 x 2 -> 64 tokens, with begin/end of image
    assert usage[1].prompt_tokens - usage[0].prompt_tokens == 64 + 2
    assert usage[2].prompt_tokens != usage[1].prompt_tokens


def test_an_image_conversations_next_turn_reuses_the_images_kv(server):
    """The image's tokens stand as a hash of its pixels: the second turn of a conversation that
    began with an image finds the image's KV cached (no second encoding, no re-prefill), and
    answers as the same turn computed afresh (another cache_salt: nothing reused) does."""
    client = server.client()
    first = client.chat.completions.create(model=MODEL, messages=_messages(0), temperature=0, max_tokens=MAX_TOKENS)
    turn = [*_messages(0), {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": "And what colour is it?"}]

    def ask(**extra):
        return client.chat.completions.create(model=MODEL, messages=turn, temperature=0, max_tokens=MAX_TOKENS,
                                              logprobs=True, extra_body=extra)

    reused, fresh = ask(), ask(cache_salt="fresh")
    assert reused.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 1  # the image's 66 too
    assert fresh.usage.prompt_tokens_details.cached_tokens == 0
    assert [t.token for t in reused.choices[0].logprobs.content] == [t.token for t in fresh.choices[0].logprobs.content]
    assert [t.logprob for t in reused.choices[0].logprobs.content] == pytest.approx(
        [t.logprob for t in fresh.choices[0].logprobs.content], abs=5e-3)


def test_without_its_projector_an_image_is_a_400(model):
    srv = RemoteServer("--model", str(model[1]), "--served-model-name", MODEL, "--mmproj", "none")
    try:
        client = srv.client()
        with pytest.raises(openai.BadRequestError, match="does not accept image input"):
            client.chat.completions.create(model=MODEL, messages=_messages(0), max_tokens=1)
        assert client.chat.completions.create(model=MODEL, messages=_messages(None), max_tokens=1).choices
    finally:
        srv.stop()


def _serve(*args: str):
    import subprocess

    return subprocess.run([sys.executable, "-m", "glmserve", "serve", "--port", "0", *args],
                          capture_output=True, text=True, timeout=120)


def test_a_projector_libmtmd_refuses_is_a_one_line_start_up_error(model):
    for args, needle in [(("--mmproj", str(model[1])), "libmtmd cannot load the projector"),
                         (("--mmproj", str(model[1].parent / "nope.gguf")), "no such file")]:
        proc = _serve("--model", str(model[1]), *args)
        err = proc.stderr.strip()
        assert proc.returncode != 0 and "Traceback" not in proc.stderr, err
        assert len(err.splitlines()) == 1 and needle in err, err
