"""A 64k context on a GGUF shaped as GLM-4.7-Flash (47 layers, 576-wide latent KV cache, 202,752
training positions; tiny hidden sizes, so the weights are 12 MB), as the README's recipe runs it:
the server starts with ``--n-ctx 65536`` where a split cache would take 8 x 65,536 cells (26 GiB),
holds what llama-server's ``-c 65536`` holds for the KV cache (65,536 cells), and answers; the KV
cache types reach llama.cpp (a q8_0 cache takes 34/64 of the f16 one's memory); and the offload
flags are taken on this CPU build, which reports no layer offloaded."""

from __future__ import annotations

import re
from pathlib import Path

import openai

from tests.conftest import RemoteServer

MODEL = "flash"
CELL_F16 = 47 * 576 * 2  # bytes of one KV cell: 47 layers of a 576-wide latent K, f16; no V cells (MLA)
CELLS = 65536


def rss(server: RemoteServer) -> int:
    """The server process's resident memory in bytes."""
    for line in Path(f"/proc/{server.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def serve(gguf: Path, *flags: str) -> tuple[int, str, dict]:
    """Start a server on ``gguf`` with ``flags``, ask it one greedy question; its memory once it
    answered, its log and its model card."""
    server = RemoteServer("--model", str(gguf), "--served-model-name", MODEL, "--max-num-seqs", "8", *flags)
    try:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)
        reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                               max_tokens=4, temperature=0)
        assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 4
        card = client.models.retrieve(MODEL).model_dump()
        return rss(server), server.log(), card
    finally:
        server.stop()


def test_the_readme_context_starts_unified_and_holds_what_llama_server_holds(flash_gguf):
    small, log, card = serve(flash_gguf, "--n-ctx", "256", "--n-gpu-layers", "all", "--cpu-moe")
    # this CPU build offloads nothing, whatever is asked, and says so
    assert (card["backend"], card["n_gpu_layers"]) == ("CPU", 0)
    assert re.search(r"llama.cpp backend CPU \(devices: CPU \([^)]*MiB free\)\); 0 of 48 layers offloaded; tensors kept "
                     r"by pattern: ", log)
    big, log, card = serve(flash_gguf, "--n-ctx", str(CELLS))
    assert card["max_model_len"] == CELLS
    assert "unified, 65536 cells shared by the 8 sequences" in log  # the choice, said at start
    assert f"KV cache (unified): {CELLS} cells" in log
    # what the 64k context added is the 65,536 cells llama-server's -c 65536 allocates (llama.cpp
    # writes every cell at start), within a quarter; a split cache would have added 8 times that
    added, kv = big - small, (CELLS - 256) * CELL_F16
    assert 0.9 * kv <= added <= 1.25 * kv, (added, kv)


def test_a_q8_0_cache_reaches_llama_cpp_and_answers(flash_gguf):
    f16, _, _ = serve(flash_gguf, "--n-ctx", str(CELLS))
    q8, log, _ = serve(flash_gguf, "--n-ctx", str(CELLS), "--cache-type-k", "q8_0", "--cache-type-v", "q8_0")
    assert "(K q8_0, V q8_0)" in log
    saved = CELLS * 47 * 576 * (2 - 34 / 32)  # f16: 2 bytes an element; q8_0: 34 bytes a block of 32
    assert 0.8 * saved <= f16 - q8 <= 1.2 * saved, (f16 - q8, saved)
