"""Images on llama_cpp through libmtmd, llama.cpp's multimodal library (``llama_cpp.mtmd_cpp``),
as llama-server's ``--mmproj``: a GGUF of the model's vision encoder and projector (what
llama.cpp's converter writes with ``--mmproj``; for GLM-4.1V / 4.5V / 4.6V its GLM4V projector).

``Projector.process(text, images)`` is the engine's ``multimodal`` processor: the chat template's
text, with one image placeholder per image (``PLACEHOLDERS``), becomes libmtmd's chunks
(``mtmd_tokenize_from_parts``: text parts and decoded RGB bitmaps, so no marker a client writes
can stand for an image; libmtmd adds the model's own tokens around each image and sizes it as
the model's processor would). The token ids returned hold the text chunks' tokens and, for each
image, ``n_tokens`` of its ``prompt_cache.media_token`` (from a hash of its pixels: the KV of an
image a conversation sent before is reused, in a slot or from the host prompt cache, as
llama-server reuses image chunks by their hash), described by a ``MediaSpan`` whose ``chunk`` is
the image's libmtmd chunk. The engine decodes an image whole (``batch.BatchDecoder``): encoded by
the vision encoder and its embeddings decoded at the image's positions
(``mtmd_helper_eval_chunk_single``; under GLM-4V's multimodal RoPE an image of ``w x h``
merged patches takes ``max(w, h)`` positions, and the text after it goes on from there).

As in llama-server, the prompt is tokenized on the request's thread while the engine's thread
encodes other images with the same libmtmd context.
"""

from __future__ import annotations

import ctypes
import logging
import weakref
from pathlib import Path
from typing import Any

import llama_cpp
import llama_cpp.mtmd_cpp as mtmd
from llama_cpp._logger import llama_log_callback
from llama_cpp._utils import suppress_stdout_stderr

from glmserve.engine.base import EngineError
from glmserve.engine.llama_cpp.kv.prompt_cache import media_token
from glmserve.engine.llama_cpp.kv.sequence import MediaSpan
from glmserve.engine.llama_cpp.settings import LlamaCppSettings

log = logging.getLogger("glmserve.engine.llama_cpp")

# what a chat template writes for one image content part, which libmtmd's chunks replace (it
# writes the model's begin/end tokens itself): GLM-4.1V / 4.5V / 4.6V's
PLACEHOLDERS = ("<|begin_of_image|><|image|><|end_of_image|>",)


def find_mmproj(setting: str | None, model_path: Path) -> Path | None:
    """The projector GGUF in force: ``--mmproj`` (a file; ``none``: text only), else the one
    ``mmproj-*.gguf`` beside the model (llama.cpp's and published GGUFs' naming), else None.
    Raises ``EngineError`` for a missing file or several candidates."""
    if setting == "none":
        return None
    if setting is not None:
        path = Path(setting).expanduser()
        if not path.is_file():
            raise EngineError(f"--mmproj {setting}: no such file")
        return path
    found = sorted(model_path.parent.glob("mmproj-*.gguf"))
    if len(found) > 1:
        raise EngineError(f"{len(found)} projectors beside {model_path.name} ({', '.join(f.name for f in found)}): "
                          "give --mmproj FILE, or --mmproj none for text only")
    return found[0] if found else None


class Projector:
    """A libmtmd context over ``model`` (a ``LlamaModel``) from the projector GGUF ``path``, on the
    first GPU where ``use_gpu`` (libmtmd's choice, as llama-server's: ggml's first GPU device,
    else its first integrated one, else the CPU). Raises ``EngineError`` when libmtmd refuses it
    (not a projector, or one for another model) or it takes no images. ``free()`` releases it."""

    def __init__(self, model, path: Path, n_threads: int, use_gpu: bool = False) -> None:
        # libmtmd's log lines follow llama.cpp's (llama-cpp-python's logger: errors only, engine.py)
        mtmd.mtmd_log_set(llama_log_callback, ctypes.c_void_p(0))
        mtmd.mtmd_helper_log_set(llama_log_callback, ctypes.c_void_p(0))
        params = mtmd.mtmd_context_params_default()
        params.use_gpu, params.n_threads, params.print_timings, params.warmup = use_gpu, n_threads, False, False
        with suppress_stdout_stderr(disable=False):
            self._ctx = mtmd.mtmd_init_from_file(str(path).encode(), model.model, params)
        if not self._ctx:
            raise EngineError(f"libmtmd cannot load the projector {path} for this model (not an mmproj GGUF, or "
                              "one made for another model)")
        if not mtmd.mtmd_support_vision(self._ctx):
            self.free()
            raise EngineError(f"the projector {path} takes no images")
        self.path = path

    def process(self, text: str, images: list[Any]) -> tuple[list[int], tuple[MediaSpan, ...]]:
        """The prompt ``text`` (a chat template's, one placeholder per image) and its decoded
        PIL ``images`` -> (token ids with the image's ``media_token`` for each image token, the
        images' spans). Raises ``ValueError`` (a 400) when the placeholders and the images disagree in
        number, or the prompt ends with an image."""
        pieces = _split(text)
        if len(pieces) - 1 != len(images):
            raise ValueError(f"the chat template wrote {len(pieces) - 1} image placeholders for {len(images)} "
                             f"images (this engine knows the placeholder {' or '.join(PLACEHOLDERS)})")
        bitmaps, keep, parts, media_ids = [], [], [], []  # keep: what the parts point to, alive until tokenized
        for i, piece in enumerate(pieces):
            if piece:
                data = piece.encode()
                keep.append(data)
                part_text = mtmd.mtmd_input_text(data, len(data), False, True)
                keep.append(part_text)
                parts.append(mtmd.mtmd_input_part(ctypes.pointer(part_text), None))
            if i < len(images):
                rgb = images[i].convert("RGB")
                pixels = rgb.tobytes()
                media_ids.append(media_token(b"%d,%d," % rgb.size + pixels))
                bitmap = mtmd.mtmd_bitmap_init(rgb.width, rgb.height,
                                               (ctypes.c_uint8 * len(pixels)).from_buffer_copy(pixels))
                bitmaps.append(bitmap)
                parts.append(mtmd.mtmd_input_part(None, bitmap))
        chunks = mtmd.mtmd_input_chunks_init()
        try:
            array = (ctypes.POINTER(mtmd.mtmd_input_part) * len(parts))(*(ctypes.pointer(p) for p in parts))
            if (ret := mtmd.mtmd_tokenize_from_parts(self._ctx, chunks, array, len(parts), False)) != 0:
                raise ValueError(f"libmtmd could not read an image (status {ret})")
            return self._tokens(chunks, media_ids)
        finally:
            mtmd.mtmd_input_chunks_free(chunks)
            for bitmap in bitmaps:
                mtmd.mtmd_bitmap_free(bitmap)

    def _tokens(self, chunks, media_ids: list[int]) -> tuple[list[int], tuple[MediaSpan, ...]]:
        ids: list[int] = []
        spans: list[MediaSpan] = []
        n_chunks = mtmd.mtmd_input_chunks_size(chunks)
        for i in range(n_chunks):
            chunk = mtmd.mtmd_input_chunks_get(chunks, i)
            kind = mtmd.mtmd_input_chunk_get_type(chunk)
            if kind == mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT:
                n = ctypes.c_size_t(0)
                tokens = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                ids.extend(tokens[:n.value])
                continue
            if kind != mtmd.MTMD_INPUT_CHUNK_TYPE_IMAGE:
                raise ValueError("libmtmd made a chunk that is neither text nor an image")
            if i == n_chunks - 1:
                raise ValueError("the prompt ends with an image: the model needs text after it to answer from")
            n_tokens = mtmd.mtmd_input_chunk_get_n_tokens(chunk)
            spans.append(MediaSpan(len(ids), n_tokens, mtmd.mtmd_input_chunk_get_n_pos(chunk),
                                   _Image(self._ctx, mtmd.mtmd_input_chunk_copy(chunk))))
            ids.extend([media_ids[len(spans) - 1]] * n_tokens)
        return ids, tuple(spans)

    def free(self) -> None:
        if self._ctx:
            mtmd.mtmd_free(self._ctx)
            self._ctx = None


class _Image:
    """One image's libmtmd chunk (freed with this object), decoded by ``decode``."""

    def __init__(self, ctx, chunk) -> None:
        self._ctx, self._chunk = ctx, chunk
        weakref.finalize(self, mtmd.mtmd_input_chunk_free, chunk)

    def decode(self, lctx, pos: int, seq_id: int, n_batch: int) -> None:
        """Encode the image and decode its embeddings into sequence ``seq_id`` of context
        ``lctx`` from position ``pos``, ``n_batch`` at a time. Raises ``RuntimeError``."""
        end = llama_cpp.llama_pos(0)
        ret = mtmd.mtmd_helper_eval_chunk_single(self._ctx, lctx, self._chunk, pos, seq_id, n_batch, False,
                                                 ctypes.byref(end))
        if ret != 0:
            raise RuntimeError(f"libmtmd could not encode or decode an image (status {ret})")


def _split(text: str) -> list[str]:
    """``text`` split at each image placeholder (``PLACEHOLDERS``)."""
    for placeholder in PLACEHOLDERS:
        if placeholder in text:
            return text.split(placeholder)
    return [text]


def load_projector(model, settings: LlamaCppSettings, model_path: Path, mtp: bool) -> Projector | None:
    """The projector for ``model`` (``find_mmproj`` of ``--mmproj``), loaded, on a GPU unless
    ``--no-mmproj-offload`` or ``--batch-invariant`` (measured on the CPU backend only), or None.
    Raises ``EngineError`` (``find_mmproj``'s, ``Projector``'s, or one with ``--speculative mtp``,
    whose context does not follow image cells)."""
    path = find_mmproj(settings.mmproj, model_path)
    use_gpu = not (settings.no_mmproj_offload or settings.batch_invariant)
    if path is None:
        return None
    if mtp:
        raise EngineError(f"--speculative mtp does not take image input yet (projector {path}): give --mmproj none "
                          "to serve text only with MTP, or leave out --speculative mtp")
    projector = Projector(model, path, settings.n_threads, use_gpu)
    log.info("image input through libmtmd: projector %s%s", path, "" if use_gpu else " (in host memory)")
    return projector
