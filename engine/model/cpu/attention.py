"""The CPU attention backend: the torch backend with two C++ kernels (ops.cpp).

K/V are written in one call, and attention reads straight from the paged pool (no gathered
copy of the context, no mask) for every request, whatever its number of query tokens:
decodes, draft verifications, prefill chunks, whole prompts and the recompute after a
preemption. Head shapes the kernel does not take keep SDPA.

One kernel, for every query count, is what makes the engine batch-invariant: the kernel
computes each query row on its own, in a fixed order (ops.cpp, paged_attention), so a token's
attention output has the same bits whether it is decoded alone, batched with others, verified
as part of a draft, or recomputed in a long prefill. SDPA's blocked arithmetic depends on the
query count (and rounds the probabilities to bf16), so routing long segments to it made a
request's tokens depend on how the scheduler cut its prompt. Decodes run faster on it than
on gather + SDPA; a long prompt's attention alone runs slower than SDPA's blocked matmuls,
and over whole workloads the difference is small (`python -m benchmarks.kernel_bench`;
docs/performance.md).

Since the kernel takes every request of a step (`takes_whole_step`), one kernel call serves
the whole step's attention per layer, and a model whose plan runs the C++ layer loop (its
layout's row in engine/model/layouts.py allows it) runs its whole layer loop in C++
(`LlamaModel.runs_cpp_layer_loop` decides per step, in one place).
"""

from __future__ import annotations

import torch

from engine.model.attention.base import AttentionMetadata
from engine.model.attention.torch_backend import TorchAttention


class CpuAttention(TorchAttention):
    name = "cpu"

    def store_kv(self, k_cache, v_cache, k, v, meta: AttentionMetadata) -> None:
        torch.ops.servelab.store_kv(k_cache, v_cache, k, v, meta.slot_mapping)  # skips -1 slots

    def forward(self, q, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        if self.takes_whole_step(meta, q.shape[1], k_cache.shape[2], q.shape[2]):
            return torch.ops.servelab.paged_attention(q, k_cache, v_cache, meta.block_tables,
                                                      meta.seq_lens, meta.query_start_loc, scale)
        return super().forward(q, k_cache, v_cache, meta, scale)

    def takes_whole_step(self, meta: AttentionMetadata, num_heads: int, num_kv_heads: int,
                         head_dim: int) -> bool:
        """True when the kernel takes the step: it has requests and the heads' shape fits."""
        return bool(meta.query_lens) and self.heads_fit(num_heads, num_kv_heads, head_dim)

    @staticmethod
    def heads_fit(num_heads: int, num_kv_heads: int, head_dim: int) -> bool:
        """The kernel's shapes: head dim 64 or 128, at most 8 query heads per KV head."""
        return head_dim in (64, 128) and num_heads // num_kv_heads <= 8
