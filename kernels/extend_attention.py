"""Paged extend attention: several query tokens per request, causal over the paged context.

Covers every step that is not pure decode: a prefill chunk (chunked prefill), or `[last, *draft]`
during speculative verification. The new tokens' K/V are already in the pool when this runs, so
sequence s attends to `seq_lens[s]` cached tokens, and its query i (of q_len) sits at position
`seq_len - q_len + i` and sees keys at positions <= that. Keys are gathered through the block
table as in PagedAttention (Kwon et al., vLLM, SOSP 2023); the loop over key tiles keeps an online
softmax as in FlashAttention (Dao et al. 2022), so no score matrix is materialised.

GQA: one program takes BLOCK_Q query tokens times all query heads of one KV head, stacked as the
rows of one tile (row r = token r // BLOCK_G, head r % BLOCK_G), so each K/V tile is read once
per group of heads. Grid: (num_seqs, cdiv(max_query_len, BLOCK_Q), num_kv_heads); programs past
their sequence's query length return at once. Key tiles past the block's last query position are
never loaded (causal skip).

`paged_extend_attention_ref` is the torch reference the kernel is tested against.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from servelab_kernels._common import (
    LOG2E,
    check_paged_args,
    dot_in_storage_dtype,
    gather_context_ref,
    load_kv_tile,
    load_q_tile,
    next_pow2,
    online_softmax_step,
    paged_strides,
    softmax_state,
)


@triton.jit
def _extend_kernel(
    q_ptr,  # [num_tokens, num_heads, head_dim] query tokens of all sequences, flattened
    k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim] key pool
    v_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim] value pool
    out_ptr,  # [num_tokens, num_heads, head_dim] output
    block_tables_ptr,  # [num_seqs, max_blocks] int32 physical block of each logical block
    seq_lens_ptr,  # [num_seqs] int32 context length, this step's tokens included
    query_start_loc_ptr,  # [num_seqs + 1] int32 first query token of each sequence
    scale_log2,  # softmax scale * log2(e): scores are kept in base 2 (exp2 is cheaper)
    stride_qt,  # q: elements between tokens
    stride_qh,  # q: elements between heads (head_dim stride is 1)
    stride_ot,  # out: elements between tokens
    stride_oh,  # out: elements between heads (head_dim stride is 1)
    stride_cb,  # pools: elements between blocks
    stride_ct,  # pools: elements between slots of one block
    stride_ch,  # pools: elements between KV heads (head_dim stride is 1)
    stride_bts,  # block_tables: elements between sequences
    GROUP: tl.constexpr,  # query heads per KV head (num_heads // num_kv_heads)
    HEAD_DIM: tl.constexpr,  # elements per head
    BLOCK_SIZE: tl.constexpr,  # slots per pool block
    BLOCK_G: tl.constexpr,  # GROUP rounded up to a power of two
    BLOCK_Q: tl.constexpr,  # query tokens per program (BLOCK_Q * BLOCK_G >= 16 rows)
    BLOCK_D: tl.constexpr,  # HEAD_DIM rounded up to a power of two (>= 16 for tl.dot)
    BLOCK_N: tl.constexpr,  # context tokens per inner tile
    LOWP: tl.constexpr,  # dots in the pool's 16-bit dtype (else exact fp32)
):
    seq = tl.program_id(0)
    qblk = tl.program_id(1)
    kvh = tl.program_id(2)

    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    if qblk * BLOCK_Q >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    prefix = seq_len - q_len  # cached tokens before this step's first query

    offs_m = tl.arange(0, BLOCK_Q * BLOCK_G)  # [M] rows = (token, head) pairs
    offs_d = tl.arange(0, BLOCK_D)  # [D]
    offs_n = tl.arange(0, BLOCK_N)  # [N]
    qi = qblk * BLOCK_Q + offs_m // BLOCK_G  # [M] query index within the sequence
    g = offs_m % BLOCK_G  # [M] head within the group
    d_mask = offs_d < HEAD_DIM
    row_mask = (qi < q_len) & (g < GROUP)
    q_pos = prefix + qi  # [M] absolute position of each row's token
    tok = (q_start + qi).to(tl.int64)
    heads = kvh * GROUP + g

    q = load_q_tile(
        q_ptr, tok * stride_qt + heads * stride_qh, row_mask, offs_d, d_mask, k_cache_ptr, LOWP
    )  # [M, D]
    m_i, l_i, acc = softmax_state(BLOCK_Q * BLOCK_G, BLOCK_D)  # [M], [M], [M, D]

    # Keys after this block's last query position are masked for every row: never load them.
    kv_end = tl.minimum(seq_len, prefix + (qblk + 1) * BLOCK_Q)
    bt_row = block_tables_ptr + seq * stride_bts
    head_off = kvh * stride_ch
    for n0 in range(0, kv_end, BLOCK_N):
        pos = n0 + offs_n  # [N] logical key positions
        n_mask = pos < kv_end
        k, v = load_kv_tile(
            k_cache_ptr, v_cache_ptr, bt_row, pos, n_mask, head_off, offs_d, d_mask,
            stride_cb, stride_ct, BLOCK_SIZE, LOWP,
        )  # [N, D] each
        visible = n_mask[None, :] & (pos[None, :] <= q_pos[:, None])  # causal, offset by prefix
        # Position 0 is in the first tile and visible to every row: the running max stays finite.
        m_i, l_i, acc = online_softmax_step(q, k, v, visible, scale_log2, m_i, l_i, acc, LOWP)

    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    o = acc / l_safe[:, None]
    tl.store(
        out_ptr + tok[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
        o.to(out_ptr.dtype.element_ty),
        mask=row_mask[:, None] & d_mask[None, :],
    )


def choose_block_q(max_query_len: int, block_g: int, rows: int = 64) -> int:
    """Query tokens per program: about `rows` tile rows, >= 16 rows (tl.dot), no more than asked."""
    block_q = max(1, rows // block_g)
    block_q = min(block_q, next_pow2(max(1, max_query_len)))
    return max(block_q, max(1, 16 // block_g))


def extend_kernel_meta(
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    cache_dtype: torch.dtype,
    max_query_len: int,
    *,
    block_q: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int = 2,
) -> dict:
    """Constexpr arguments and launch options of `_extend_kernel`
    (also benchmarks/gpu/compile_check.py)."""
    group = num_heads // num_kv_heads
    block_g = next_pow2(group)
    block_d = max(16, next_pow2(head_dim))  # tl.dot needs K >= 16; extra lanes are masked
    lowp = dot_in_storage_dtype(cache_dtype)
    if block_n is None:  # exact fp32 dots hold more registers: smaller tiles, more warps
        block_n = (64 if block_d <= 64 else 32) if lowp else (32 if block_d <= 64 else 16)
    block_q = block_q or choose_block_q(max_query_len, block_g)
    assert block_n >= 16 and block_n == next_pow2(block_n), block_n
    assert block_q == next_pow2(block_q) and block_q * block_g >= 16, (block_q, block_g)
    return dict(
        GROUP=group,
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        BLOCK_G=block_g,
        BLOCK_Q=block_q,
        BLOCK_D=block_d,
        BLOCK_N=block_n,
        LOWP=lowp,
        num_warps=num_warps or (4 if lowp else 8),
        num_stages=num_stages,
    )


def paged_extend_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
    *,
    max_query_len: int | None = None,
    block_q: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int = 2,
) -> torch.Tensor:
    """Causal attention of each sequence's query tokens to its paged context.

    q: [num_tokens, num_heads, head_dim], sequence s owning tokens
    query_start_loc[s]:query_start_loc[s+1]; pools: [num_blocks, block_size, num_kv_heads,
    head_dim]; block_tables: [num_seqs, max_blocks] int32; seq_lens: [num_seqs] int32 (context
    after this step's tokens were stored) -> out like q.
    max_query_len: host-side max query length (read from the device when omitted).
    block_q, block_n, num_warps, num_stages: launch overrides (tests, tuning); None = defaults.
    """
    check_paged_args(q, k_cache, v_cache, block_tables, seq_lens)
    num_tokens, num_heads, head_dim = q.shape
    _, block_size, kvh, _ = k_cache.shape
    num_seqs = seq_lens.shape[0]
    assert query_start_loc.dtype == torch.int32 and query_start_loc.shape == (num_seqs + 1,)
    if out is None:
        out = torch.empty_like(q)
    if num_tokens == 0 or num_seqs == 0:
        return out
    if q.stride(-1) != 1:
        q = q.contiguous()
    assert out.stride(-1) == 1
    if max_query_len is None:
        max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max().item())
    meta = extend_kernel_meta(
        num_heads, kvh, head_dim, block_size, k_cache.dtype, max_query_len, block_q=block_q,
        block_n=block_n, num_warps=num_warps, num_stages=num_stages,
    )
    grid = (num_seqs, triton.cdiv(max_query_len, meta["BLOCK_Q"]), kvh)
    _extend_kernel[grid](
        q,
        k_cache,
        v_cache,
        out,
        block_tables,
        seq_lens,
        query_start_loc,
        scale * LOG2E,
        *paged_strides(q, out, k_cache, block_tables),
        **meta,
    )
    return out


def paged_extend_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Torch reference in fp32, one sequence at a time, causal mask offset by the cached prefix."""
    num_heads = q.shape[1]
    out = torch.empty_like(q)
    starts = query_start_loc.tolist()
    for s in range(seq_lens.shape[0]):
        a, b = starts[s], starts[s + 1]
        if b == a:
            continue
        n, ql = int(seq_lens[s]), b - a
        k, v = gather_context_ref(k_cache, v_cache, block_tables[s], n, num_heads)  # [n, H, D]
        scores = torch.einsum("qhd,nhd->hqn", q[a:b].float(), k) * scale  # [H, ql, n]
        pos = torch.arange(n, device=q.device)
        qpos = torch.arange(n - ql, n, device=q.device)
        scores = scores.masked_fill(pos[None, None, :] > qpos[None, :, None], float("-inf"))
        out[a:b] = torch.einsum("hqn,nhd->qhd", scores.softmax(-1), v).to(q.dtype)
    return out
