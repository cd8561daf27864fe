"""TritonAttention (engine/model/attention/triton_backend.py, over the kernels of kernels/)
against engine.model.attention.TorchAttention."""

import pytest
import torch
from kernel_cases import DTYPES, LAYOUT_IDS, LAYOUTS, TOL, make_pool, random_tables, rel_err

from engine.model.attention import TorchAttention, build_metadata, get_backend
from engine.model.attention.triton_backend import TritonAttention


def _step(layout, dtype, rows, block_size=16, seed=30):
    """One engine step: rows of (query_len, seq_len); the new tokens' slots are the last q."""
    h, kvh, d = layout
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [n for _, n in rows]
    tables, _, num_blocks = random_tables(seq_lens, block_size, gen)
    slots = []
    for (ql, n), row in zip(rows, tables):
        for pos in range(n - ql, n):
            slots.append(row[pos // block_size] * block_size + pos % block_size)
    meta = build_metadata([q for q, _ in rows], seq_lens, tables, slots, block_size)
    k_cache, v_cache = make_pool(num_blocks, block_size, kvh, d, dtype, gen)
    t = len(slots)
    q = torch.randn((t, h, d), generator=gen).to(dtype)
    k = torch.randn((t, kvh, d), generator=gen).to(dtype)
    v = torch.randn((t, kvh, d), generator=gen).to(dtype)
    return meta, k_cache, v_cache, q, k, v, d**-0.5


def _compare(layout, dtype, rows):
    meta, k_cache, v_cache, q, k, v, scale = _step(layout, dtype, rows)
    torch_be, triton_be = TorchAttention(), TritonAttention()
    kt, vt = k_cache.clone(), v_cache.clone()
    torch_be.store_kv(kt, vt, k, v, meta)
    kx, vx = k_cache.clone(), v_cache.clone()
    triton_be.store_kv(kx, vx, k, v, meta)
    assert torch.equal(kt, kx) and torch.equal(vt, vx)
    ref = torch_be.forward(q, kt, vt, meta, scale)
    out = triton_be.forward(q, kx, vx, meta, scale)
    assert out.shape == q.shape and out.dtype == q.dtype and not out.isnan().any()
    assert rel_err(out, ref) < TOL[dtype]
    # a second "layer" on the same metadata reuses meta._cache and must not mix results up
    out2 = triton_be.forward(q * 0.5, kx, vx, meta, scale)
    ref2 = torch_be.forward(q * 0.5, kt, vt, meta, scale)
    assert rel_err(out2, ref2) < TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_backend_decode_only(layout, dtype):
    _compare(layout, dtype, [(1, 1), (1, 16), (1, 29), (1, 66)])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_backend_mixed_batch(layout, dtype):
    # decode rows, a whole prompt, a prefill chunk over a cached prefix, a verification row
    _compare(layout, dtype, [(1, 40), (12, 12), (1, 3), (9, 33), (5, 21)])


def test_get_backend_resolves_triton():
    be = get_backend("triton")
    assert isinstance(be, TritonAttention) and be.name == "triton"
