"""``docs/guides/model-memory.md``'s KV table, recomputed: each row's KV per token and its 8k,
32k and 128k columns are what ``memory.kv_shape`` (the planner's own arithmetic) gives for the
row's layers and KV heads x head size (or GLM-4.7-Flash's latent, cached as llama.cpp's
``deepseek2`` GGUF describes it: one 576-wide K per layer, no V), at f16."""

from __future__ import annotations

import re
from pathlib import Path

from glmserve.engine.llama_cpp.loading.memory import kv_shape

PAGE = Path(__file__).resolve().parents[3] / "docs" / "guides" / "model-memory.md"
GIB = 2**30


def _rows() -> list[list[str]]:
    table = PAGE.read_text().split("| model | layers |", 1)[1].split("\n\n", 1)[0]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in table.splitlines()[2:]]


def _bytes_per_token(layers: int, heads: str) -> int:
    if latent := re.fullmatch(r"latent (\d+)\+(\d+)", heads):
        width = int(latent.group(1)) + int(latent.group(2))
        metadata = {"general.architecture": "deepseek2", "deepseek2.attention.key_length": str(width),
                    "deepseek2.attention.kv_lora_rank": latent.group(1)}
        return kv_shape(metadata, layers, 20, 1, 2048).bytes_per_cell()
    n_head_kv, head = (int(x) for x in heads.split(" x "))
    metadata = {"general.architecture": "glm4", "glm4.attention.key_length": str(head)}
    return kv_shape(metadata, layers, 32, n_head_kv, 4096).bytes_per_cell()


def test_the_kv_table_is_what_the_planner_computes():
    rows = _rows()
    assert [row[0] for row in rows][:3] == ["GLM-4-9B, GLM-4-9B-0414", "GLM-4-32B-0414", "GLM-4.7-Flash"]
    for model, layers, heads, per_token, *contexts in rows:
        per = _bytes_per_token(int(layers), heads)
        assert per_token == f"{per / 1024:.3g} KiB", model
        assert contexts == [f"{per * n / GIB:.2f} GiB" for n in (8192, 32768, 131072)], model
