"""Compile, when a GPU engine starts, every Triton kernel variant its serving steps can launch.

Triton compiles a kernel the first time it meets a new *specialization*: new constexprs (the
extend kernel's BLOCK_Q follows the step's longest query, the combine kernel's BLOCK_S the
split count, the split kernel's DIRECT whether there is one split) or an integer argument that
is newly 1 or a multiple of 16 (the block table's width, the split count). A compile stalls the
step it lands in. In the H200 check that first served one request alone inside the timed run
(`assets/bench/gpu-check-h200-3.json`), each of its four prefill steps took about 290 ms,
against 2 ms for a decode step, and that was gone once a one-seat run went first. vLLM and
SGLang warm up at startup for the same reason. It took 12.4 s for the first engine on a fresh
H200 and 0.01 s for each later one in the same process; Triton also keeps compiled kernels in
its cache on disk, which a later process loads instead of compiling (not timed here).

`warm_up` calls the three kernels over a two-block scratch pool of the engine's layout and dtype
(never the engine's own pool) with each variant a step of this engine can reach. The step's
integer arrays always start 16-byte aligned (`build_step`), so pointer alignment adds no
variants of its own.
"""

from __future__ import annotations

import math

import torch
from servelab_kernels._common import next_pow2
from servelab_kernels.decode_attention import (
    choose_splits,
    paged_decode_attention,
    split_kernel_meta,
)
from servelab_kernels.extend_attention import choose_block_q, paged_extend_attention
from servelab_kernels.store_kv import store_kv


def width_classes(need: int, max_blocks: int) -> list[int]:
    """The narrowest table width of each integer class (1, a multiple of 16, other) that holds
    need blocks, leaving out widths past max_blocks, which no step's table has."""
    need = max(1, need)
    out = {1} if need == 1 else set()
    out.add(-(-need // 16) * 16)
    out.add(need if need % 16 and need > 1 else need + 1)
    return sorted(w for w in out if w <= max(max_blocks, need))


def reachable_splits(num_kv_heads: int, max_seqs: int, max_len: int, block_n: int,
                     device: torch.device) -> list[int]:
    """Every split count `choose_splits` gives a decode step of at most max_seqs requests of
    at most max_len tokens (it changes only at whole tiles, so one length a tile is enough)."""
    lengths = sorted({min(max_len, t * block_n) for t in range(1, -(-max_len // block_n) + 1)})
    return sorted({choose_splits(n, num_kv_heads, L, block_n, device)[0]
                   for n in range(1, max_seqs + 1) for L in lengths})


def plan(num_heads: int, num_kv_heads: int, head_dim: int, block_size: int,
         dtype: torch.dtype, max_seqs: int, max_len: int, max_query_len: int,
         device: torch.device) -> dict:
    """The variants to compile: split counts for decode, query lengths for extend, and the
    block-table widths to pair them with."""
    max_blocks = -(-max_len // block_size)
    block_n = split_kernel_meta(num_heads, num_kv_heads, head_dim, block_size, dtype,
                                direct=True)["BLOCK_N"]
    splits = reachable_splits(num_kv_heads, max_seqs, max_len, block_n, device)
    group = next_pow2(num_heads // num_kv_heads)
    # one query length per BLOCK_Q (the smallest giving it)
    by_block_q: dict[int, int] = {}
    for q in (min(1 << i, max_query_len) for i in range(next_pow2(max_query_len).bit_length())):
        by_block_q.setdefault(choose_block_q(q, group), q)
    return {"splits": splits, "block_n": block_n, "query_lens": sorted(by_block_q.values()),
            "max_blocks": max_blocks}


def warm_up(num_heads: int, num_kv_heads: int, head_dim: int, block_size: int,
            dtype: torch.dtype, max_seqs: int, max_len: int, max_query_len: int,
            device: torch.device | str) -> dict:
    """Launch every planned variant once over a scratch pool; returns the plan and the number
    of launches. Outputs are discarded: the scratch pool holds zeros."""
    device = torch.device(device)
    p = plan(num_heads, num_kv_heads, head_dim, block_size, dtype, max_seqs, max_len,
             max_query_len, device)
    k_cache = torch.zeros(2, block_size, num_kv_heads, head_dim, dtype=dtype, device=device)
    v_cache = torch.zeros_like(k_cache)
    scale = 1.0 / math.sqrt(head_dim)
    launches = 0
    for tokens in (1, 2, 16, 17):  # store_kv: the token count is the grid, but warm both ways
        kv = torch.zeros(tokens, num_kv_heads, head_dim, dtype=dtype, device=device)
        store_kv(k_cache, v_cache, kv, kv, torch.zeros(tokens, dtype=torch.long, device=device))
        launches += 1
    for seqs in (1, 2):
        # extend: every BLOCK_Q, each with the narrowest table of each width class that
        # holds its queries
        for q_len in p["query_lens"]:
            for width in width_classes(-(-q_len // block_size), p["max_blocks"]):
                tables = torch.zeros(seqs, width, dtype=torch.int32, device=device)
                q = torch.zeros(seqs * q_len, num_heads, head_dim, dtype=dtype, device=device)
                qsl = torch.arange(0, seqs * q_len + 1, q_len, dtype=torch.int32, device=device)
                lens = torch.full((seqs,), q_len, dtype=torch.int32, device=device)
                paged_extend_attention(q, k_cache, v_cache, tables, lens, qsl, scale,
                                       max_query_len=q_len)
                launches += 1
        # decode: every reachable split count, each with the narrowest table of each width
        # class that holds its context (s splits of one tile each)
        q = torch.zeros(seqs, num_heads, head_dim, dtype=dtype, device=device)
        for s in p["splits"]:
            ctx = s * p["block_n"]
            for width in width_classes(-(-ctx // block_size), p["max_blocks"]):
                tables = torch.zeros(seqs, width, dtype=torch.int32, device=device)
                lens = torch.full((seqs,), ctx, dtype=torch.int32, device=device)
                paged_decode_attention(q, k_cache, v_cache, tables, lens, scale,
                                       max_seq_len=ctx, num_splits=s)
                launches += 1
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return {**p, "launches": launches}
