"""KV store: write each new token's K and V into the paged pool at its slot.

This is PagedAttention's cache write (Kwon et al., "Efficient Memory Management for Large
Language Model Serving with PagedAttention", SOSP 2023; vLLM's `reshape_and_cache`): token t's
K/V go to physical block `slot_mapping[t] // block_size`, offset `slot_mapping[t] % block_size`.
A slot of -1 means "do not store" (padding, or a token whose K/V is already cached).

One program per token copies all its KV heads at once, for K and V, casting to the pool dtype.
`store_kv_ref` is the torch reference the kernel is tested against.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from servelab_kernels._common import check_device, next_pow2


@triton.jit
def _store_kv_kernel(
    k_ptr,  # [num_tokens, num_kv_heads, head_dim] this step's keys (any float dtype)
    v_ptr,  # [num_tokens, num_kv_heads, head_dim] this step's values
    k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim] key pool (written)
    v_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim] value pool (written)
    slot_mapping_ptr,  # [num_tokens] int64: block * block_size + offset, -1 = skip
    stride_kt,  # k: elements between tokens
    stride_kh,  # k: elements between heads (head_dim stride is 1)
    stride_vt,  # v: elements between tokens
    stride_vh,  # v: elements between heads
    stride_cb,  # pools: elements between blocks
    stride_ct,  # pools: elements between slots of one block
    stride_ch,  # pools: elements between heads (head_dim stride is 1)
    NUM_KV_HEADS: tl.constexpr,  # KV heads per token
    HEAD_DIM: tl.constexpr,  # elements per head
    BLOCK_SIZE: tl.constexpr,  # slots per pool block
    BLOCK_H: tl.constexpr,  # NUM_KV_HEADS rounded up to a power of two
    BLOCK_D: tl.constexpr,  # HEAD_DIM rounded up to a power of two
):
    tok = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + tok).to(tl.int64)
    offs_h = tl.arange(0, BLOCK_H)  # [BLOCK_H]
    offs_d = tl.arange(0, BLOCK_D)  # [BLOCK_D]
    keep = (offs_h * 0 + slot) >= 0  # [BLOCK_H] (a vector: the interpreter rejects scalar masks)
    mask = keep[:, None] & (offs_h[:, None] < NUM_KV_HEADS) & (offs_d[None, :] < HEAD_DIM)
    slot = tl.maximum(slot, 0)  # keep addresses in range even when skipped
    blk = slot // BLOCK_SIZE
    off = slot % BLOCK_SIZE

    k = tl.load(k_ptr + tok * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :], mask=mask)
    v = tl.load(v_ptr + tok * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :], mask=mask)
    dst = blk * stride_cb + off * stride_ct + offs_h[:, None] * stride_ch + offs_d[None, :]
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def store_kernel_meta(num_kv_heads: int, head_dim: int, block_size: int) -> dict:
    """Constexpr arguments and launch options of `_store_kv_kernel`
    (also benchmarks/gpu/compile_check.py)."""
    return dict(
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        BLOCK_H=next_pow2(num_kv_heads),
        BLOCK_D=next_pow2(head_dim),
        num_warps=4 if num_kv_heads * head_dim >= 1024 else 1,
    )


def store_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write k, v [num_tokens, num_kv_heads, head_dim] into the pools at slot_mapping (-1 = skip).

    Pools: [num_blocks, block_size, num_kv_heads, head_dim], contiguous, written in place.
    """
    check_device(k_cache)
    num_tokens = k.shape[0]
    if num_tokens == 0:
        return
    _, block_size, kvh, d = k_cache.shape
    assert v_cache.shape == k_cache.shape and k_cache.is_contiguous() and v_cache.is_contiguous()
    assert k.shape == v.shape == (num_tokens, kvh, d), (k.shape, v.shape, k_cache.shape)
    assert slot_mapping.shape == (num_tokens,)
    if k.stride(-1) != 1:
        k = k.contiguous()
    if v.stride(-1) != 1:
        v = v.contiguous()
    _store_kv_kernel[(num_tokens,)](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        **store_kernel_meta(kvh, d, block_size),
    )


def store_kv_ref(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Torch reference: one token at a time, in place."""
    block_size = k_cache.shape[1]
    for t, slot in enumerate(slot_mapping.tolist()):
        if slot < 0:
            continue
        k_cache[slot // block_size, slot % block_size] = k[t].to(k_cache.dtype)
        v_cache[slot // block_size, slot % block_size] = v[t].to(v_cache.dtype)
