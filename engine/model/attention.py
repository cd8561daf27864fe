"""Paged attention over the KV pool: the metadata every backend reads, and the torch backend.

"Paged" lives entirely in two arrays (the nano-vllm framing):
  * `slot_mapping[t]`  where token t's new K/V is written (block * block_size + offset; -1 = skip)
  * `block_tables[s]`  which physical blocks hold sequence s's context, in logical order
Both KV layouts (contiguous and paged) fill these same arrays, so there is one attention path.

Pool layout, per layer:  k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim]

A backend has two methods: `store_kv` (write this step's K/V into the pool) and `forward`
(each query token attends causally to its sequence's cached context, which already includes
the tokens written this step). The Triton backend in `kernels/` implements the same two.
A third, `whole_step_in_kernel`, says when the C++ layer loop (CpuAttention only) may run
the whole step instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


@dataclass
class AttentionMetadata:
    """One flat batch: sequence s owns query tokens query_start_loc[s]:query_start_loc[s+1]."""

    slot_mapping: torch.Tensor  # [num_tokens] int64, -1 = do not store
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32, cumulative query lengths
    seq_lens: torch.Tensor  # [num_seqs] int32, context length after this step's tokens are stored
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32, padded with 0 past each seq's blocks
    block_size: int
    query_lens: list[int] = field(default_factory=list)  # host copies, for python-side loops
    seq_lens_host: list[int] = field(default_factory=list)
    _cache: dict = field(default_factory=dict, repr=False)  # per-step derived tensors (backends)

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    @property
    def max_query_len(self) -> int:
        return max(self.query_lens) if self.query_lens else 0

    @property
    def max_seq_len(self) -> int:
        return max(self.seq_lens_host) if self.seq_lens_host else 0

    @property
    def is_decode_only(self) -> bool:
        return all(q == 1 for q in self.query_lens)


def build_metadata(
    query_lens: list[int],
    seq_lens: list[int],
    block_tables: list[list[int]],
    slot_mapping: list[int],
    block_size: int,
    device: torch.device | str = "cpu",
) -> AttentionMetadata:
    """Host lists -> device tensors. block_tables may be ragged; they are padded with 0."""
    assert len(query_lens) == len(seq_lens) == len(block_tables)
    max_blocks = max((len(b) for b in block_tables), default=1) or 1
    bt = torch.zeros((len(block_tables), max_blocks), dtype=torch.int32)
    for i, row in enumerate(block_tables):
        if row:
            bt[i, : len(row)] = torch.tensor(row, dtype=torch.int32)
    qsl = torch.zeros(len(query_lens) + 1, dtype=torch.int32)
    if query_lens:
        qsl[1:] = torch.cumsum(torch.tensor(query_lens, dtype=torch.int32), 0)
    return AttentionMetadata(
        slot_mapping=torch.tensor(slot_mapping, dtype=torch.int64).to(device),
        query_start_loc=qsl.to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32).to(device),
        block_tables=bt.to(device),
        block_size=block_size,
        query_lens=list(query_lens),
        seq_lens_host=list(seq_lens),
    )


def additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean keep-mask as SDPA's additive one (0 / -inf): what SDPA would convert it to
    on every call, here once per step instead of once per layer (same numbers)."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))


class TorchAttention:
    """Reference backend: gathers each sequence's context through its block table, then SDPA.

    The flat batch is cut into segments: runs of consecutive rows with the same query length
    (all the decodes of a step; verifications drafting the same k), each one [B, m] SDPA call
    that reads its queries and writes its outputs in place, with no padding and no scatter.
    A prefill chunk is usually a segment of its own. Every mask is causal, offset by the
    cached context.
    """

    name = "torch"

    def whole_step_in_kernel(self, meta, num_heads: int, num_kv_heads: int, head_dim: int
                             ) -> bool:
        """True if one C++ kernel call serves the whole step's attention, so the C++ layer
        loop (engine/model/cpu_ops.cpp decode_layers) may run it; never for this backend."""
        return False

    def store_kv(self, k_cache, v_cache, k, v, slot_mapping) -> None:
        # k, v: [num_tokens, num_kv_heads, head_dim]; caches: [num_blocks, block_size, kvh, d]
        kvh, d = k_cache.shape[2], k_cache.shape[3]
        if slot_mapping.numel() and int(slot_mapping.min()) < 0:  # idle static rows: skip -1s
            keep = slot_mapping >= 0
            slot_mapping, k, v = slot_mapping[keep], k[keep], v[keep]
        k_cache.view(-1, kvh, d).index_copy_(0, slot_mapping, k.to(k_cache.dtype))
        v_cache.view(-1, kvh, d).index_copy_(0, slot_mapping, v.to(v_cache.dtype))

    def _plan(self, meta: AttentionMetadata, dtype: torch.dtype) -> list[tuple]:
        """Per-step segments (first token, B rows, m queries each, block ids [B*nb], additive
        mask [B, 1, m, nb*bs]), computed once and shared by all layers."""
        if "plan" in meta._cache:
            return meta._cache["plan"]
        bs = meta.block_size
        device = meta.block_tables.device
        starts = meta.query_start_loc.tolist()
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


class CpuAttention(TorchAttention):
    """The torch backend with C++ kernels (engine/model/cpu_ops.cpp): K/V written in one
    call, and attention read straight from the paged pool, with no gathered copy of the
    context and no mask, for every request bringing at most MAX_KERNEL_QUERY tokens (decodes,
    draft verifications, short prompts and chunks). When every request of the step does, one
    kernel call serves the whole step; otherwise longer segments keep SDPA, whose blocked
    matmuls suit long queries (each query costs the kernel a pass over its context), and so
    do head shapes the kernel does not take."""

    name = "cpu"
    MAX_KERNEL_QUERY = 64  # requests bringing at most this many tokens use the kernel

    def store_kv(self, k_cache, v_cache, k, v, slot_mapping) -> None:
        torch.ops.servelab.store_kv(k_cache, v_cache, k, v, slot_mapping)  # skips -1 slots

    def forward(self, q, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        if self.whole_step_in_kernel(meta, q.shape[1], k_cache.shape[2], q.shape[2]):
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

    def whole_step_in_kernel(self, meta, num_heads: int, num_kv_heads: int, head_dim: int
                             ) -> bool:
        """True when the kernel takes every request of the step (each brings at most
        MAX_KERNEL_QUERY tokens) and the heads' shape."""
        return (bool(meta.query_lens) and max(meta.query_lens) <= self.MAX_KERNEL_QUERY
                and self.heads_fit(num_heads, num_kv_heads, head_dim))

    @staticmethod
    def heads_fit(num_heads: int, num_kv_heads: int, head_dim: int) -> bool:
        """The kernel's shapes: head dim 64 or 128, at most 8 query heads per KV head."""
        return head_dim in (64, 128) and num_heads // num_kv_heads <= 8


def get_backend(name: str):
    """'torch', 'cpu' or 'triton' (already resolved from 'auto' by the engine, which has
    loaded the C++ kernels for 'cpu')."""
    if name == "torch":
        return TorchAttention()
    if name == "cpu":
        return CpuAttention()
    if name == "triton":
        from kernels.backend import TritonAttention  # imported lazily: triton is optional

        return TritonAttention()
    raise ValueError(f"attention_backend must be 'torch' or 'triton', got {name!r}")
