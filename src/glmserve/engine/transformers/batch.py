"""The running sequences' KV cache as one left-padded ``DynamicCache`` (TGI's ``CausalLMBatch``
shape): row ``i`` of every layer's keys/values is one sequence, right-aligned, with an attention
mask marking the padding. A prefilled sequence joins by padding the shorter side on the left
and concatenating; finished rows leave by index selection, and padding columns no row needs
any more are trimmed away.

Tensors are ``[batch, kv_heads, positions, head_dim]`` per layer, and a sparse-attention layer's
indexer keys (transformers' ``DynamicIndexedLayer``: GLM-5, DeepSeek-V3.2) ``[batch, positions,
index_head_dim]``; the mask is ``[batch, positions]`` of 0/1 (long), which the indexer also
applies, so padding is never selected.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import DynamicCache


def _left_pad(t: torch.Tensor, n: int, dim: int) -> torch.Tensor:
    if n == 0:
        return t
    pad = [0, 0] * (t.dim() - 1 - dim % t.dim()) + [n, 0]
    return F.pad(t, pad)


class PaddedKVBatch:
    """See module docstring. Used from the engine thread only."""

    def __init__(self) -> None:
        self.cache: DynamicCache | None = None
        self.mask: torch.Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.mask is None else self.mask.shape[0]

    def add(self, cache: DynamicCache, length: int) -> None:
        """Append a one-sequence cache holding ``length`` positions as the last row."""
        mask = torch.ones((1, length), dtype=torch.long, device=cache.layers[0].keys.device)
        if self.cache is None:
            self.cache, self.mask = cache, mask
            return
        width = self.mask.shape[1]
        grow_old, grow_new = max(0, length - width), max(0, width - length)
        for old, new in zip(self.cache.layers, cache.layers):
            old.keys = torch.cat([_left_pad(old.keys, grow_old, 2), _left_pad(new.keys, grow_new, 2)])
            old.values = torch.cat([_left_pad(old.values, grow_old, 2), _left_pad(new.values, grow_new, 2)])
            if getattr(old, "indexer_keys", None) is not None:
                old.indexer_keys = torch.cat([_left_pad(old.indexer_keys, grow_old, 1),
                                              _left_pad(new.indexer_keys, grow_new, 1)])
        self.mask = torch.cat([_left_pad(self.mask, grow_old, 1), _left_pad(mask, grow_new, 1)])

    def keep(self, rows: list[int]) -> None:
        """Keep only ``rows`` (in that order); drop columns that are padding in every kept row."""
        if not rows:
            self.cache = self.mask = None
            return
        if rows == list(range(len(self))):
            return
        index = torch.tensor(rows, dtype=torch.long, device=self.mask.device)
        mask = self.mask.index_select(0, index)
        start = int(mask.any(dim=0).long().argmax())
        self.mask = mask[:, start:]
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(0, index)[:, :, start:]
            layer.values = layer.values.index_select(0, index)[:, :, start:]
            if getattr(layer, "indexer_keys", None) is not None:
                layer.indexer_keys = layer.indexer_keys.index_select(0, index)[:, start:]

    def next_mask(self) -> torch.Tensor:
        """The attention mask for one more position in every row (commit it with ``advance``)."""
        return torch.cat([self.mask, self.mask.new_ones((self.mask.shape[0], 1))], dim=1)

    def advance(self, mask: torch.Tensor) -> None:
        self.mask = mask
