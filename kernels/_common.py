"""Helpers shared by the kernels.

Host side (plain Python): interpreter detection, launch-size choices, the input checks and the
stride arguments of the two attention wrappers, and the context gather of their torch references.

Device side (`@triton.jit`, inlined into the kernels that call them): the pieces of paged
attention that decode and extend share: loading the query tile, gathering one K/V tile through
the block table, and folding it into an online softmax (Milakov & Gimelshein 2018).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

LOW_PRECISION = (torch.float16, torch.bfloat16)
LOG2E = 1.4426950408889634  # log2(e): the kernels take scale * LOG2E and work in base 2 (exp2)


def interpret_requested() -> bool:
    """TRITON_INTERPRET is set now (to anything but "" or "0")."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def interpreting() -> bool:
    """True when Triton runs these kernels in its CPU interpreter.

    Triton reads TRITON_INTERPRET once per kernel, when `@triton.jit` decorates it, so what
    counts is the variable at the moment this package was imported, not its value now.
    """
    return _INTERPRETED


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (and >= 1): Triton block shapes must be powers of two."""
    return 1 << max(0, int(n) - 1).bit_length()


def check_cuda_not_interpreted(device: torch.device | str) -> None:
    """Refuse a CUDA device while TRITON_INTERPRET is (or was, at import) set: ValueError.

    The interpreter accepts CUDA tensors: it copies every argument to the host, runs the kernel
    there in numpy and copies the results back. Nothing fails, it is only thousands of times
    slower, so a GPU run or test would measure the interpreter without saying so.
    """
    if torch.device(device).type != "cuda" or not (interpreting() or interpret_requested()):
        return
    raise ValueError(
        "attention_backend='triton' on CUDA while TRITON_INTERPRET is set "
        f"(TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET', '')!r} now, kernels "
        f"{'interpreted' if interpreting() else 'compiled'} at import): Triton would run every "
        "kernel in its CPU interpreter. Unset TRITON_INTERPRET in a fresh process, or use "
        "attention_backend='torch'."
    )


def check_device(t: torch.Tensor) -> None:
    """Triton needs CUDA tensors (never interpreted), or CPU tensors under the interpreter."""
    check_cuda_not_interpreted(t.device)
    if t.device.type == "cpu" and not interpreting():
        raise RuntimeError(
            "the Triton kernels need CUDA tensors; for CPU tensors set TRITON_INTERPRET=1 "
            "before triton or kernels.* is imported"
        )


def dot_in_storage_dtype(cache_dtype: torch.dtype) -> bool:
    """Run tl.dot on 16-bit K/V directly (fp32 accumulation), as tensor cores want.

    fp32 storage uses exact fp32 products (input_precision="ieee", not TF32). The interpreter
    computes bf16 dots wrongly (numpy has no bf16), so there bf16 is widened to fp32 first.
    """
    if cache_dtype not in LOW_PRECISION:
        return False
    return not (interpreting() and cache_dtype == torch.bfloat16)


# ---- host side of the paged attention wrappers -------------------------------------------------
def check_paged_args(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
) -> None:
    """Input checks shared by the decode and extend wrappers (AssertionError when one fails).

    q: [rows, num_heads, head_dim]; pools: [num_blocks, block_size, num_kv_heads, head_dim], both
    contiguous and of one shape, num_heads a multiple of num_kv_heads; block_tables
    [num_seqs, max_blocks] and seq_lens [num_seqs] int32.
    """
    check_device(q)
    _, num_heads, head_dim = q.shape
    _, _, kvh, d = k_cache.shape
    assert d == head_dim and num_heads % kvh == 0, (q.shape, k_cache.shape)
    assert v_cache.shape == k_cache.shape and k_cache.is_contiguous() and v_cache.is_contiguous()
    assert block_tables.dtype == torch.int32 and seq_lens.dtype == torch.int32


def paged_strides(
    q: torch.Tensor, out: torch.Tensor, k_cache: torch.Tensor, block_tables: torch.Tensor
) -> tuple[int, ...]:
    """The eight stride arguments both attention kernels take, in their order.

    q and out: between rows (tokens or sequences) and heads; pools: between blocks, slots and KV
    heads; block_tables: between sequences. The head_dim stride of all of them must be 1.
    """
    return (
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        block_tables.stride(0),
    )


def gather_context_ref(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_len: int,
    num_heads: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch references: one sequence's K and V in fp32, [seq_len, num_heads, head_dim] each.

    Position p is read from pool block block_table[p // block_size], slot p % block_size; each KV
    head is repeated for the num_heads // num_kv_heads query heads that share it (GQA).
    """
    block_size, kvh = k_cache.shape[1], k_cache.shape[2]
    pos = torch.arange(seq_len, device=k_cache.device)
    blocks = block_table[pos // block_size].long()
    k = k_cache[blocks, pos % block_size].float()  # [seq_len, kvh, D]
    v = v_cache[blocks, pos % block_size].float()
    return (
        k.repeat_interleave(num_heads // kvh, dim=1),
        v.repeat_interleave(num_heads // kvh, dim=1),
    )


# ---- device side: jitted pieces of the attention kernels ---------------------------------------
@triton.jit
def load_q_tile(q_ptr, row_off, row_mask, offs_d, d_mask, k_cache_ptr, LOWP: tl.constexpr):
    """The query tile [R, D]: row r is q_ptr[row_off[r] + d]; masked rows and lanes read 0.

    Cast for the QK^T dot: to the pool's 16-bit dtype when LOWP, else to fp32.
    """
    q = tl.load(
        q_ptr + row_off[:, None] + offs_d[None, :],
        mask=row_mask[:, None] & d_mask[None, :],
        other=0.0,
    )  # [R, D]
    if LOWP:
        q = q.to(k_cache_ptr.dtype.element_ty)
    else:
        q = q.to(tl.float32)
    return q


@triton.jit
def softmax_state(ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    """Empty online-softmax state for ROWS query rows: (m_i [R], l_i [R], acc [R, D]), fp32."""
    m_i = tl.full([ROWS], float("-inf"), tl.float32)  # running max (base-2 scores)
    l_i = tl.zeros([ROWS], tl.float32)  # running sum of exp2(score - m_i)
    acc = tl.zeros([ROWS, BLOCK_D], tl.float32)  # running sum of p * v
    return m_i, l_i, acc


@triton.jit
def load_kv_tile(
    k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim] key pool
    v_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim] value pool
    bt_row,  # pointer to this sequence's block-table row (int32 physical block numbers)
    pos,  # [N] logical positions to read
    n_mask,  # [N] which of them exist
    head_off,  # pool offset of this KV head (kvh * stride_ch)
    offs_d,  # [D] lanes of head_dim
    d_mask,  # [D] offs_d < HEAD_DIM
    stride_cb,  # pools: elements between blocks
    stride_ct,  # pools: elements between slots of one block
    BLOCK_SIZE: tl.constexpr,  # slots per pool block
    LOWP: tl.constexpr,  # keep the pool's 16-bit dtype for the dots (else widen to fp32)
):
    """K and V at logical positions `pos`, gathered through the block table: (k, v), [N, D] each.

    Position p lives in physical block bt_row[p // BLOCK_SIZE], slot p % BLOCK_SIZE
    (PagedAttention). Masked positions and lanes read 0.
    """
    blk = tl.load(bt_row + pos // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
    kv_off = blk * stride_cb + (pos % BLOCK_SIZE) * stride_ct + head_off  # [N]
    kv_mask = n_mask[:, None] & d_mask[None, :]
    k = tl.load(k_cache_ptr + kv_off[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
    v = tl.load(v_cache_ptr + kv_off[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
    if not LOWP:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    return k, v


@triton.jit
def online_softmax_step(q, k, v, visible, scale_log2, m_i, l_i, acc, LOWP: tl.constexpr):
    """Fold one key tile into the online-softmax state; returns the new (m_i, l_i, acc).

    q [R, D]; k, v [N, D]; visible [R, N] (or [1, N]): which scores count. Scores are
    q @ k^T * scale_log2, in base 2 (exp2 is cheaper than exp). Every row must see a key in its
    first tile, or its running max stays -inf and exp2(-inf - -inf) gives NaN.
    Dots: 16-bit inputs with fp32 accumulation when LOWP, else exact fp32 (no TF32).
    """
    if LOWP:
        qk = tl.dot(q, tl.trans(k))  # [R, N] fp32 accumulation
    else:
        qk = tl.dot(q, tl.trans(k), input_precision="ieee")
    qk = tl.where(visible, qk * scale_log2, float("-inf"))

    m_new = tl.maximum(m_i, tl.max(qk, 1))  # [R]
    alpha = tl.exp2(m_i - m_new)  # rescales what was summed under the old max
    p = tl.exp2(qk - m_new[:, None])  # [R, N]
    l_i = l_i * alpha + tl.sum(p, 1)
    if LOWP:
        pv = tl.dot(p.to(v.dtype), v)
    else:
        pv = tl.dot(p, v, input_precision="ieee")
    acc = acc * alpha[:, None] + pv
    return m_new, l_i, acc


# Triton decorated the jitted functions above as interpreted or compiled, by TRITON_INTERPRET at
# this module's import; every kernel module imports this one first, so they share the mode.
_INTERPRETED = not isinstance(load_q_tile, triton.runtime.JITFunction)
