"""Paged attention over the KV pool: the metadata every backend reads, and the torch backend.

"Paged" lives entirely in two arrays (the nano-vllm framing):
  * `slot_mapping[t]`  where token t's new K/V is written (block * block_size + offset; -1 = skip)
  * `block_tables[s]`  which physical blocks hold sequence s's context, in logical order
Both KV layouts (contiguous and paged) fill these same arrays, so there is one attention path.

Pool layout, per layer:  k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim]

A backend has two methods: `store_kv` (write this step's K/V into the pool) and `forward`
(each query token attends causally to its sequence's cached context, which already includes
the tokens written this step). The Triton backend in `kernels/` implements the same two.
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


class TorchAttention:
    """Reference backend: gathers each sequence's context through its block table, then SDPA.

    Short rows (decodes, speculative verification) are batched into a single padded SDPA call;
    long rows (prefill chunks) run one SDPA call each. Every mask is causal, offset by the
    cached context.
    """

    name = "torch"

    def store_kv(self, k_cache, v_cache, k, v, slot_mapping) -> None:
        # k, v: [num_tokens, num_kv_heads, head_dim]; caches: [num_blocks, block_size, kvh, d]
        keep = slot_mapping >= 0
        slots = slot_mapping[keep]
        kvh, d = k_cache.shape[2], k_cache.shape[3]
        k_cache.view(-1, kvh, d).index_copy_(0, slots, k[keep].to(k_cache.dtype))
        v_cache.view(-1, kvh, d).index_copy_(0, slots, v[keep].to(v_cache.dtype))

    SHORT = 16  # rows with at most this many query tokens share one padded SDPA call

    def _plan(self, meta: AttentionMetadata):
        """Per-step gather indices, computed once and shared by all layers.

        Short rows (decodes, and [last, *draft] verifications) are padded into one batched
        call; long rows (prefill chunks) get a call each, so padding never costs much."""
        if "plan" in meta._cache:
            return meta._cache["plan"]
        bs = meta.block_size
        device = meta.block_tables.device
        short = [i for i, q in enumerate(meta.query_lens) if q <= self.SHORT]
        long = [i for i, q in enumerate(meta.query_lens) if q > self.SHORT]
        plan = {"short": None, "long": [], "uniform": None}
        starts = meta.query_start_loc.tolist()
        if short:
            rows = torch.tensor(short, device=device)
            lens = meta.seq_lens[rows].long()  # [B]
            qlens = torch.tensor([meta.query_lens[i] for i in short], device=device)  # [B]
            max_len = max(meta.seq_lens_host[i] for i in short)
            max_q = max(meta.query_lens[i] for i in short)
            nb = -(-max_len // bs)
            # gather whole blocks (one index per block, not per slot): [B, nb] block ids;
            # slots past a sequence's length are masked out below
            blocks = meta.block_tables[rows][:, :nb].long()
            pos = torch.arange(nb * bs, device=device)
            qi = torch.arange(max_q, device=device)
            qpos = lens[:, None] - qlens[:, None] + qi[None, :]  # [B, max_q] position of query i
            mask = pos[None, None, :] <= qpos[:, :, None]  # [B, max_q, nb*bs], causal
            qvalid = qi[None, :] < qlens[:, None]  # [B, max_q]
            mask = mask | ~qvalid[:, :, None] & (pos == 0)[None, None, :]  # pad rows: no NaN
            qstart = meta.query_start_loc[rows].long()
            qidx = torch.where(qvalid, qstart[:, None] + qi[None, :], torch.zeros_like(qpos))
            plan["short"] = (qidx, qvalid, blocks, mask[:, None])
            if not long and min(meta.query_lens) == max_q:  # every row has max_q queries:
                plan["uniform"] = max_q  # the flat batch IS [B, max_q], no gather or scatter
        for i in long:
            n, q = meta.seq_lens_host[i], meta.query_lens[i]
            blocks = meta.block_tables[i, :-(-n // bs)].long()
            pos = torch.arange(n, device=device)
            qpos = torch.arange(n - q, n, device=device)
            mask = pos[None, :] <= qpos[:, None]  # [q, n] causal, offset by the cached context
            plan["long"].append((starts[i], starts[i] + q, blocks, n, mask))
        meta._cache["plan"] = plan
        return plan

    def forward(self, q, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        # q: [num_tokens, num_heads, head_dim] -> out: same shape
        kvh, d = k_cache.shape[2], k_cache.shape[3]
        out = torch.empty_like(q)
        plan = self._plan(meta)
        if plan["short"] is not None:
            qidx, qvalid, blocks, mask = plan["short"]
            B, nb = blocks.shape
            m = plan["uniform"]
            qs = q[qidx] if m is None else q.view(B, m, *q.shape[1:])  # [B, max_q, H, D]
            qs = qs.transpose(1, 2)  # [B, H, max_q, D]
            k = k_cache[blocks].view(B, -1, kvh, d).to(q.dtype).transpose(1, 2)  # [B, kvh, L, D]
            v = v_cache[blocks].view(B, -1, kvh, d).to(q.dtype).transpose(1, 2)
            o = F.scaled_dot_product_attention(qs, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
            if m is not None:
                return o.transpose(1, 2).reshape(q.shape)
            out[qidx[qvalid]] = o.transpose(1, 2)[qvalid]
        for start, end, blocks, n, mask in plan["long"]:
            qs = q[start:end].transpose(0, 1)  # [H, q, D]
            k = k_cache[blocks].view(-1, kvh, d)[:n].to(q.dtype).transpose(0, 1)  # [kvh, n, D]
            v = v_cache[blocks].view(-1, kvh, d)[:n].to(q.dtype).transpose(0, 1)
            o = F.scaled_dot_product_attention(qs, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
            out[start:end] = o.transpose(0, 1)
        return out


def get_backend(name: str):
    """'torch' or 'triton' (already resolved from 'auto' by the engine)."""
    if name == "torch":
        return TorchAttention()
    if name == "triton":
        from kernels.backend import TritonAttention  # imported lazily: triton is optional

        return TritonAttention()
    raise ValueError(f"attention_backend must be 'torch' or 'triton', got {name!r}")
