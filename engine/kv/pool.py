"""The KV pool: real tensors holding every cached key and value.

Per layer, `k` and `v` are [num_blocks, block_size, num_kv_heads, head_dim]. Physical slot
`s` is block `s // block_size`, offset `s % block_size`. Both allocators hand out blocks of
this same pool, so attention has one code path whatever the layout.
"""

from __future__ import annotations

import torch


class KVPool:
    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device):
        self.num_blocks, self.block_size = num_blocks, block_size
        shape = (num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim)
        self.data = torch.zeros(shape, dtype=dtype, device=device)
        # per layer (k_cache, v_cache), each [num_blocks, block_size, num_kv_heads, head_dim]
        self.layers = [(self.data[i, 0], self.data[i, 1]) for i in range(num_layers)]

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()

    @staticmethod
    def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int,
                        dtype: torch.dtype) -> int:
        return 2 * num_layers * block_size * num_kv_heads * head_dim * dtype.itemsize

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        """Copy every layer's K and V of block src into block dst, for each (src, dst)."""
        src = torch.tensor([a for a, _ in pairs], device=self.data.device)
        dst = torch.tensor([b for _, b in pairs], device=self.data.device)
        self.data[:, :, dst] = self.data[:, :, src]
