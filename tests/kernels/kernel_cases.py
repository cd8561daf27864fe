"""Random paged batches for the kernel tests: shuffled, non-contiguous blocks in a larger pool."""

from __future__ import annotations

import torch

# (num_heads, num_kv_heads, head_dim): the bundled SmolLM2-135M, and a 7B-class GQA layout
LAYOUTS = [(9, 3, 64), (32, 8, 128)]
LAYOUT_IDS = ["smollm2-9q3kv64", "7b-32q8kv128"]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOL = {torch.float32: 1e-3, torch.float16: 1e-2, torch.bfloat16: 1e-2}


def make_pool(num_blocks, block_size, kvh, d, dtype, gen):
    """K and V pools filled with random values everywhere, so a wrong block read shows."""
    shape = (num_blocks, block_size, kvh, d)
    k = torch.randn(shape, generator=gen).to(dtype)
    v = torch.randn(shape, generator=gen).to(dtype)
    return k, v


def random_tables(seq_lens, block_size, gen, spare=5):
    """Block tables using a random permutation of a pool with `spare` unused blocks.

    Returns (rows as python lists, padded int32 tensor, num_blocks).
    """
    need = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(need) + spare
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    rows, i = [], 0
    for nb in need:
        rows.append(perm[i : i + nb])
        i += nb
    width = max(max(need), 1)
    table = torch.zeros((len(rows), width), dtype=torch.int32)
    for s, row in enumerate(rows):
        table[s, : len(row)] = torch.tensor(row, dtype=torch.int32)
    return rows, table, num_blocks


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max |out - ref| / max |ref| in fp32."""
    out, ref = out.float(), ref.float()
    return ((out - ref).abs().max() / ref.abs().max().clamp_min(1e-12)).item()
