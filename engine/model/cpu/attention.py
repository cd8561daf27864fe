"""The CPU attention backend: the torch backend with two C++ kernels (ops.cpp).

K/V are written in one call, and attention reads straight from the paged pool (no gathered
copy of the context, no mask) for every request bringing at most MAX_KERNEL_QUERY tokens:
decodes, draft verifications, short prompts and chunks. Longer segments keep SDPA, whose
blocked matmuls suit long queries (each query costs the kernel a pass over its context), and
so do head shapes the kernel does not take.

When every request of a step fits the kernel (`takes_whole_step`), one kernel call serves the
whole step's attention per layer, and a model with AMX weights may run its whole layer loop in
C++ (`LlamaModel.forward` decides, in one place).
"""

from __future__ import annotations

import torch

from engine.model.attention.base import AttentionMetadata
from engine.model.attention.torch_backend import TorchAttention


class CpuAttention(TorchAttention):
    name = "cpu"
    MAX_KERNEL_QUERY = 64  # requests bringing at most this many tokens use the kernel

    def store_kv(self, k_cache, v_cache, k, v, meta: AttentionMetadata) -> None:
        torch.ops.servelab.store_kv(k_cache, v_cache, k, v, meta.slot_mapping)  # skips -1 slots

    def forward(self, q, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        if self.takes_whole_step(meta, q.shape[1], k_cache.shape[2], q.shape[2]):
            return torch.ops.servelab.paged_attention(q, k_cache, v_cache, meta.block_tables,
                                                      meta.seq_lens, meta.query_start_loc, scale)
        return super().forward(q, k_cache, v_cache, meta, scale)

    def _segment(self, q, k_cache, v_cache, meta: AttentionMetadata, seg: int,
                 scale: float) -> torch.Tensor:
        _, B, m, _, _ = meta._cache["plan"][seg]
        if m > self.MAX_KERNEL_QUERY or not self.heads_fit(q.shape[1], k_cache.shape[2],
                                                           q.shape[2]):
            return super()._segment(q, k_cache, v_cache, meta, seg, scale)
        first = meta._cache["plan_rows"][seg]
        starts = torch.arange(0, (B + 1) * m, m, dtype=torch.int32)
        return torch.ops.servelab.paged_attention(q, k_cache, v_cache,
                                                  meta.block_tables[first:first + B],
                                                  meta.seq_lens[first:first + B], starts, scale)

    def takes_whole_step(self, meta: AttentionMetadata, num_heads: int, num_kv_heads: int,
                         head_dim: int) -> bool:
        """True when the kernel takes every request of the step (each brings at most
        MAX_KERNEL_QUERY tokens) and the heads' shape."""
        return (bool(meta.query_lens) and max(meta.query_lens) <= self.MAX_KERNEL_QUERY
                and self.heads_fit(num_heads, num_kv_heads, head_dim))

    @staticmethod
    def heads_fit(num_heads: int, num_kv_heads: int, head_dim: int) -> bool:
        """The kernel's shapes: head dim 64 or 128, at most 8 query heads per KV head."""
        return head_dim in (64, 128) and num_heads // num_kv_heads <= 8
