"""TritonAttention: the engine's attention backend built from the paged Triton kernels
(kernels/, imported as servelab_kernels: they know nothing of the engine; this adapter does).

The two methods of `engine.model.attention.AttentionBackend` (the contract):
  * `store_kv`  writes this step's K/V into the pool at `slot_mapping` (PagedAttention's cache
                write, Kwon et al., vLLM 2023)          -> kernels/store_kv.py
  * `forward`   decode-only steps use split-K decode attention with a combine step
                (flash-decoding, Dao et al. 2023)        -> kernels/decode_attention.py
                any other step (prefill chunks, speculative verification, mixed batches) uses
                the causal extend kernel for every row   -> kernels/extend_attention.py

Per-step values the kernels need on the host side (max lengths, the split plan's buffers) are
derived once per step and kept in `meta._cache`, which every layer of the step shares. This
module imports triton (through the kernels): the registry (attention/__init__.py) imports it
only when "triton" is asked for.
"""

from __future__ import annotations

import torch
from servelab_kernels._common import check_cuda_not_interpreted
from servelab_kernels.decode_attention import paged_decode_attention
from servelab_kernels.extend_attention import paged_extend_attention
from servelab_kernels.store_kv import store_kv

from engine.model.attention.base import AttentionBackend


class TritonAttention(AttentionBackend):
    """Paged attention through Triton kernels; CUDA tensors, or CPU under TRITON_INTERPRET=1."""

    name = "triton"

    @staticmethod
    def check_device(device: torch.device | str) -> None:
        """Where the engine builds this backend: ValueError on CUDA while TRITON_INTERPRET is
        set (the kernels would silently run in the CPU interpreter). Every kernel call checks
        its tensors the same way."""
        check_cuda_not_interpreted(device)

    def store_kv(self, k_cache, v_cache, k, v, meta) -> None:
        # k, v: [num_tokens, num_kv_heads, head_dim]; caches: [num_blocks, block_size, kvh, d]
        store_kv(k_cache, v_cache, k, v, meta.slot_mapping)

    def forward(self, q, k_cache, v_cache, meta, scale: float) -> torch.Tensor:
        # q: [num_tokens, num_heads, head_dim] -> out: same shape
        out = torch.empty_like(q)
        num_seqs = meta.seq_lens.shape[0]
        if q.shape[0] == 0 or num_seqs == 0:
            return out
        if meta.query_lens:  # host copies: no device sync
            decode_only, max_q, max_len = meta.is_decode_only, meta.max_query_len, meta.max_seq_len
        else:  # metadata built without host lists: the kernels read the maxima from the device
            decode_only, max_q, max_len = q.shape[0] == num_seqs, None, None
        if decode_only:
            # one token per sequence, so query row s belongs to sequence s
            paged_decode_attention(
                q,
                k_cache,
                v_cache,
                meta.block_tables,
                meta.seq_lens,
                scale,
                out,
                max_seq_len=max_len,
                workspace=meta._cache.setdefault("triton_workspace", {}),
            )
        else:
            paged_extend_attention(
                q,
                k_cache,
                v_cache,
                meta.block_tables,
                meta.seq_lens,
                meta.query_start_loc,
                scale,
                out,
                max_query_len=max_q,
            )
        return out
