"""The reference attention backend: each sequence's context gathered through its block table,
then PyTorch's scaled_dot_product_attention. Runs on any device; the others are tested
against it."""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F

from engine.model.attention.base import AttentionBackend, AttentionMetadata


def additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean keep-mask as SDPA's additive one (0 / -inf): what SDPA would convert it to
    on every call, here once per step instead of once per layer (same numbers)."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))


class TorchAttention(AttentionBackend):
    """Gathers each sequence's context through its block table, then SDPA.

    The flat batch is cut into segments: runs of consecutive rows with the same query length
    (all the decodes of a step; verifications drafting the same k), each one [B, m] SDPA call
    that reads its queries and writes its outputs in place, with no padding and no scatter.
    A prefill chunk is usually a segment of its own. Every mask is causal, offset by the
    cached context.
    """

    name = "torch"

    def store_kv(self, k_cache, v_cache, k, v, meta: AttentionMetadata) -> None:
        # k, v: [num_tokens, num_kv_heads, head_dim]; caches: [num_blocks, block_size, kvh, d]
        kvh, d = k_cache.shape[2], k_cache.shape[3]
        slots = meta.slot_mapping
        if meta.stored_rows is not None:  # idle static rows (slot -1) store nothing
            rows = meta.stored_rows
            slots = slots.index_select(0, rows)
            k, v = k.index_select(0, rows), v.index_select(0, rows)
        k_cache.view(-1, kvh, d).index_copy_(0, slots, k.to(k_cache.dtype))
        v_cache.view(-1, kvh, d).index_copy_(0, slots, v.to(v_cache.dtype))

    def _plan(self, meta: AttentionMetadata, dtype: torch.dtype) -> list[tuple]:
        """Per-step segments (first token, B rows, m queries each, block ids [B*nb], additive
        mask [B, 1, m, nb*bs]), computed once and shared by all layers."""
        if "plan" in meta._cache:
            return meta._cache["plan"]
        bs = meta.block_size
        device = meta.block_tables.device
        starts = [0, *itertools.accumulate(meta.query_lens)]  # host copy: no device read
        plan, first_rows = [], []
        i = 0
        while i < meta.num_seqs:
            m = meta.query_lens[i]
            j = i + 1
            while j < meta.num_seqs and meta.query_lens[j] == m:
                j += 1
            lens = meta.seq_lens[i:j].long()  # [B] context after this step's tokens
            nb = -(-max(meta.seq_lens_host[i:j]) // bs)
            # gather whole blocks (one index per block, not per slot); slots past a sequence's
            # length are masked out
            blocks = meta.block_tables[i:j, :nb].long().reshape(-1)
            pos = torch.arange(nb * bs, device=device)
            qpos = lens[:, None] - m + torch.arange(m, device=device)  # [B, m]
            mask = pos[None, None, :] <= qpos[:, :, None]  # [B, m, nb*bs]
            plan.append((starts[i], j - i, m, blocks, additive(mask[:, None], dtype)))
            first_rows.append(i)
            i = j
        meta._cache["plan"] = plan
        meta._cache["plan_rows"] = first_rows  # the segment's first sequence
        return plan

    def forward(self, q, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        # q: [num_tokens, num_heads, head_dim] -> out: same shape
        plan = self._plan(meta, q.dtype)
        if len(plan) == 1:  # one segment (e.g. all decodes): its output is the output
            return self._segment(q, k_cache, v_cache, meta, 0, scale)
        out = torch.empty_like(q)
        for seg, (start, B, m, _, _) in enumerate(plan):
            rows = slice(start, start + B * m)
            out[rows] = self._segment(q[rows], k_cache, v_cache, meta, seg, scale)
        return out

    def _segment(self, q, k_cache, v_cache, meta: AttentionMetadata, seg: int,
                 scale: float) -> torch.Tensor:
        """Segment `seg` of the step's plan; q holds its rows only."""
        _, B, m, blocks, mask = meta._cache["plan"][seg]
        return self._sdpa(q, k_cache, v_cache, B, m, blocks, mask, scale)

    @staticmethod
    def _sdpa(q, k_cache, v_cache, B, m, blocks, mask, scale) -> torch.Tensor:
        """One segment: B rows of m queries ([B * m, H, D]) against their gathered blocks."""
        kvh, d = k_cache.shape[2], k_cache.shape[3]
        qs = q.view(B, m, *q.shape[1:]).transpose(1, 2)  # [B, H, m, D]
        # index_select copies whole blocks with memcpy; k_cache[blocks] (advanced
        # indexing) copies element by element and took twice as long
        k = k_cache.index_select(0, blocks).view(B, -1, kvh, d).to(q.dtype).transpose(1, 2)
        v = v_cache.index_select(0, blocks).view(B, -1, kvh, d).to(q.dtype).transpose(1, 2)
        o = F.scaled_dot_product_attention(qs, k, v, attn_mask=mask, scale=scale,
                                           enable_gqa=True)  # [B, H, m, D]
        return o.transpose(1, 2).reshape(B * m, *q.shape[1:])
