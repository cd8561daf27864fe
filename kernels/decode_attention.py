"""Paged decode attention: one query token per request, split over the context, then combined.

Implements the decode step of PagedAttention (Kwon et al., vLLM, SOSP 2023): each request's
context lives in fixed-size pool blocks listed by its block table, so keys are gathered block by
block instead of from one contiguous tensor. Long contexts are cut into splits processed by
separate programs, each with an online softmax (Milakov & Gimelshein 2018), and a second kernel
merges the partial results by their log-sum-exp: flash-decoding (Dao, Haziza, Massa, Sizov,
"Flash-Decoding for long-context inference", 2023).

GQA: one program serves all query heads that share a KV head, so each K/V tile is read once per
group. The group is padded to 16 rows so QK^T and PV are tensor-core dots.

Grid of the split kernel: (num_seqs, num_kv_heads, num_splits). With one split the kernel
normalises and writes the output itself and the combine kernel is skipped.

`paged_decode_attention_ref` is the torch reference the kernels are tested against.
"""

from __future__ import annotations

import functools
import math

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

MAX_SPLITS = 64  # partial results per (sequence, head); the combine kernel loads them at once
MIN_SPLIT_TOKENS = 128  # a split shorter than this costs more in the combine than it saves


@triton.jit
def _decode_split_kernel(
    q_ptr,  # [num_seqs, num_heads, head_dim] one query token per sequence
    k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim] key pool
    v_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim] value pool
    block_tables_ptr,  # [num_seqs, max_blocks] int32 physical block of each logical block
    seq_lens_ptr,  # [num_seqs] int32 context length (includes this step's token)
    out_ptr,  # [num_seqs, num_heads, head_dim] output, written here when DIRECT
    mid_o_ptr,  # [num_seqs, num_heads, num_splits, head_dim] fp32 normalised partial outputs
    mid_lse_ptr,  # [num_seqs, num_heads, num_splits] fp32 partial log2-sum-exp (-inf if empty)
    scale_log2,  # softmax scale * log2(e): scores are kept in base 2 (exp2 is cheaper)
    split_len,  # context tokens per split, a multiple of BLOCK_N
    num_splits,  # splits per sequence (size of mid_* dim 2)
    stride_qs,  # q: elements between sequences
    stride_qh,  # q: elements between heads (head_dim stride is 1)
    stride_os,  # out: elements between sequences
    stride_oh,  # out: elements between heads (head_dim stride is 1)
    stride_cb,  # pools: elements between blocks
    stride_ct,  # pools: elements between slots of one block
    stride_ch,  # pools: elements between KV heads (head_dim stride is 1)
    stride_bts,  # block_tables: elements between sequences
    GROUP: tl.constexpr,  # query heads per KV head (num_heads // num_kv_heads)
    HEAD_DIM: tl.constexpr,  # elements per head
    BLOCK_SIZE: tl.constexpr,  # slots per pool block
    BLOCK_G: tl.constexpr,  # GROUP padded to a power of two >= 16 (tl.dot's minimum)
    BLOCK_D: tl.constexpr,  # HEAD_DIM rounded up to a power of two (>= 16 for tl.dot)
    BLOCK_N: tl.constexpr,  # context tokens per inner tile
    DIRECT: tl.constexpr,  # one split: write the final output, skip mid_*
    LOWP: tl.constexpr,  # dots in the pool's 16-bit dtype (else exact fp32)
):
    seq = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)

    seq_len = tl.load(seq_lens_ptr + seq)
    start = split * split_len
    end = tl.minimum(start + split_len, seq_len)

    offs_g = tl.arange(0, BLOCK_G)  # [G] query heads of this group
    offs_d = tl.arange(0, BLOCK_D)  # [D]
    offs_n = tl.arange(0, BLOCK_N)  # [N]
    g_mask = offs_g < GROUP
    d_mask = offs_d < HEAD_DIM
    heads = kvh * GROUP + offs_g  # [G]

    q = load_q_tile(
        q_ptr, seq * stride_qs + heads * stride_qh, g_mask, offs_d, d_mask, k_cache_ptr, LOWP
    )  # [G, D]
    m_i, l_i, acc = softmax_state(BLOCK_G, BLOCK_D)  # [G], [G], [G, D]

    bt_row = block_tables_ptr + seq * stride_bts
    head_off = kvh * stride_ch
    for n0 in range(start, end, BLOCK_N):
        pos = n0 + offs_n  # [N] logical positions
        n_mask = pos < end
        k, v = load_kv_tile(
            k_cache_ptr, v_cache_ptr, bt_row, pos, n_mask, head_off, offs_d, d_mask,
            stride_cb, stride_ct, BLOCK_SIZE, LOWP,
        )  # [N, D] each
        # Every tile holds a valid position, so the running max stays finite.
        m_i, l_i, acc = online_softmax_step(
            q, k, v, n_mask[None, :], scale_log2, m_i, l_i, acc, LOWP
        )

    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    o = acc / l_safe[:, None]  # [G, D]
    out_mask = g_mask[:, None] & d_mask[None, :]
    if DIRECT:
        tl.store(
            out_ptr + seq * stride_os + heads[:, None] * stride_oh + offs_d[None, :],
            o.to(out_ptr.dtype.element_ty),
            mask=out_mask,
        )
    else:
        row = (seq * (GROUP * tl.num_programs(1)) + heads) * num_splits + split  # [G]
        tl.store(mid_o_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], o, mask=out_mask)
        lse = tl.where(l_i > 0.0, m_i + tl.log2(l_safe), float("-inf"))  # [G]
        tl.store(mid_lse_ptr + row, lse, mask=g_mask)


@triton.jit
def _decode_combine_kernel(
    mid_o_ptr,  # [num_seqs, num_heads, num_splits, head_dim] fp32 normalised partial outputs
    mid_lse_ptr,  # [num_seqs, num_heads, num_splits] fp32 partial log2-sum-exp
    seq_lens_ptr,  # [num_seqs] int32 context lengths (how many splits are non-empty)
    out_ptr,  # [num_seqs, num_heads, head_dim] output
    split_len,  # context tokens per split
    num_splits,  # splits per sequence (size of mid_* dim 2)
    stride_os,  # out: elements between sequences
    stride_oh,  # out: elements between heads (head_dim stride is 1)
    HEAD_DIM: tl.constexpr,  # elements per head
    BLOCK_D: tl.constexpr,  # HEAD_DIM rounded up to a power of two
    BLOCK_S: tl.constexpr,  # num_splits rounded up to a power of two
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + seq)
    used = tl.cdiv(seq_len, split_len)  # splits that saw at least one token

    offs_s = tl.arange(0, BLOCK_S)  # [S]
    offs_d = tl.arange(0, BLOCK_D)  # [D]
    s_mask = (offs_s < used) & (offs_s < num_splits)
    row = (seq * tl.num_programs(1) + head) * num_splits + offs_s  # [S]
    lse = tl.load(mid_lse_ptr + row, mask=s_mask, other=float("-inf"))  # [S]
    o = tl.load(
        mid_o_ptr + row[:, None] * HEAD_DIM + offs_d[None, :],
        mask=s_mask[:, None] & (offs_d[None, :] < HEAD_DIM),
        other=0.0,
    )  # [S, D]
    m = tl.max(lse, 0)
    m = tl.where(m == float("-inf"), 0.0, m)  # empty sequence: all weights 0, output 0
    w = tl.exp2(lse - m)  # [S]
    den = tl.sum(w, 0)
    den = tl.where(den > 0.0, den, 1.0)
    res = tl.sum(o * w[:, None], 0) / den  # [D]
    tl.store(
        out_ptr + seq * stride_os + head * stride_oh + offs_d,
        res.to(out_ptr.dtype.element_ty),
        mask=offs_d < HEAD_DIM,
    )


@functools.cache
def _multiprocessors(device_index: int) -> int:
    """Streaming multiprocessors of one GPU, asked once: the split plan runs per layer per step,
    and a device-properties query there is a host call on every one of them."""
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def choose_splits(
    num_seqs: int, num_kv_heads: int, max_seq_len: int, block_n: int, device: torch.device
) -> tuple[int, int]:
    """(num_splits, split_len): programs enough to fill the GPU twice, splits >= 128 tokens."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        sms = _multiprocessors(index)
    else:
        sms = 4
    tiles = max(1, math.ceil(max_seq_len / block_n))
    want = math.ceil(2 * sms / max(1, num_seqs * num_kv_heads))
    by_len = math.ceil(max_seq_len / MIN_SPLIT_TOKENS)
    splits = max(1, min(want, by_len, MAX_SPLITS, tiles))
    split_len = math.ceil(tiles / splits) * block_n
    return max(1, math.ceil(max(1, max_seq_len) / split_len)), split_len


def split_kernel_meta(
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    cache_dtype: torch.dtype,
    *,
    direct: bool,
    block_n: int | None = None,
    num_warps: int = 4,
    num_stages: int = 2,
) -> dict:
    """Constexpr arguments and launch options of `_decode_split_kernel`
    (also benchmarks/gpu/compile_check.py)."""
    block_d = max(16, next_pow2(head_dim))  # tl.dot needs K >= 16; extra lanes are masked
    group = num_heads // num_kv_heads
    block_n = block_n or (64 if block_d <= 128 else 32)
    assert block_n >= 16 and block_n == next_pow2(block_n), block_n
    return dict(
        GROUP=group,
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        BLOCK_G=max(16, next_pow2(group)),
        BLOCK_D=block_d,
        BLOCK_N=block_n,
        DIRECT=direct,
        LOWP=dot_in_storage_dtype(cache_dtype),
        num_warps=num_warps,
        num_stages=num_stages,
    )


def combine_kernel_meta(head_dim: int, num_splits: int) -> dict:
    """Constexpr arguments and launch options of `_decode_combine_kernel`."""
    return dict(
        HEAD_DIM=head_dim,
        BLOCK_D=next_pow2(head_dim),
        BLOCK_S=next_pow2(num_splits),
        num_warps=4,
    )


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
    *,
    max_seq_len: int | None = None,
    num_splits: int | None = None,
    block_n: int | None = None,
    workspace: dict | None = None,
    num_warps: int = 4,
    num_stages: int = 2,
) -> torch.Tensor:
    """Decode attention for one query token per sequence.

    q: [num_seqs, num_heads, head_dim]; pools: [num_blocks, block_size, num_kv_heads, head_dim];
    block_tables: [num_seqs, max_blocks] int32; seq_lens: [num_seqs] int32 -> out like q.
    max_seq_len: host-side max of seq_lens (read from the device when omitted).
    num_splits: force a split count (tests); by default chosen to fill the device.
    workspace: a dict reused across layers of one step to keep the partial-result buffers.
    block_n, num_warps, num_stages: launch overrides (tests, tuning).
    """
    check_paged_args(q, k_cache, v_cache, block_tables, seq_lens)
    num_seqs, num_heads, head_dim = q.shape
    _, block_size, kvh, _ = k_cache.shape
    if out is None:
        out = torch.empty_like(q)
    if num_seqs == 0:
        return out
    if q.stride(-1) != 1:
        q = q.contiguous()
    assert out.stride(-1) == 1
    if max_seq_len is None:
        max_seq_len = int(seq_lens.max().item())
    meta = split_kernel_meta(
        num_heads, kvh, head_dim, block_size, k_cache.dtype, direct=True, block_n=block_n,
        num_warps=num_warps, num_stages=num_stages,
    )
    block_n = meta["BLOCK_N"]
    if num_splits is None:
        num_splits, split_len = choose_splits(num_seqs, kvh, max_seq_len, block_n, q.device)
    else:
        tiles = max(1, math.ceil(max_seq_len / block_n))
        split_len = math.ceil(tiles / max(1, num_splits)) * block_n
        num_splits = max(1, math.ceil(max(1, max_seq_len) / split_len))
    assert num_splits <= MAX_SPLITS

    direct = meta["DIRECT"] = num_splits == 1
    if direct:
        mid_o = mid_lse = out  # unused placeholders
    else:
        key = ("decode_mid", num_seqs, num_heads, num_splits, head_dim, q.device)
        bufs = workspace.get(key) if workspace is not None else None
        if bufs is None:
            bufs = (
                torch.empty((num_seqs, num_heads, num_splits, head_dim), device=q.device,
                            dtype=torch.float32),
                torch.empty((num_seqs, num_heads, num_splits), device=q.device,
                            dtype=torch.float32),
            )
            if workspace is not None:
                workspace[key] = bufs
        mid_o, mid_lse = bufs

    _decode_split_kernel[(num_seqs, kvh, num_splits)](
        q,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        out,
        mid_o,
        mid_lse,
        scale * LOG2E,
        split_len,
        num_splits,
        *paged_strides(q, out, k_cache, block_tables),
        **meta,
    )
    if not direct:
        _decode_combine_kernel[(num_seqs, num_heads)](
            mid_o,
            mid_lse,
            seq_lens,
            out,
            split_len,
            num_splits,
            out.stride(0),
            out.stride(1),
            **combine_kernel_meta(head_dim, num_splits),
        )
    return out


def paged_decode_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Torch reference in fp32, one sequence at a time: gather the context, softmax, weight V."""
    num_seqs, num_heads, _ = q.shape
    out = torch.empty_like(q)
    for s in range(num_seqs):
        k, v = gather_context_ref(k_cache, v_cache, block_tables[s], int(seq_lens[s]), num_heads)
        scores = torch.einsum("hd,nhd->hn", q[s].float(), k) * scale  # [H, n]
        out[s] = torch.einsum("hn,nhd->hd", scores.softmax(-1), v).to(q.dtype)
    return out
