"""kernels/decode_attention.py (split-K paged decode + combine) against its torch reference."""

import pytest
import torch
from kernel_cases import DTYPES, LAYOUT_IDS, LAYOUTS, TOL, make_pool, random_tables, rel_err
from servelab_kernels.decode_attention import (
    choose_splits,
    paged_decode_attention,
    paged_decode_attention_ref,
)

SEQ_LENS = [1, 16, 37, 70]  # one token, exactly one block, odd lengths with partial last blocks


def _case(layout, dtype, seq_lens, block_size, seed):
    h, kvh, d = layout
    gen = torch.Generator().manual_seed(seed)
    _, table, num_blocks = random_tables(seq_lens, block_size, gen)
    k_cache, v_cache = make_pool(num_blocks, block_size, kvh, d, dtype, gen)
    q = torch.randn((len(seq_lens), h, d), generator=gen).to(dtype)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    return q, k_cache, v_cache, table, lens, d**-0.5


@pytest.mark.parametrize("splits", [None, 3], ids=["auto-splits", "3-splits"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_decode_matches_reference(layout, dtype, splits):
    q, kc, vc, table, lens, scale = _case(layout, dtype, SEQ_LENS, 16, seed=10)
    out = torch.full_like(q, float("nan"))  # poisoned: every element must be written
    ws = {}
    res = paged_decode_attention(
        q, kc, vc, table, lens, scale, out, max_seq_len=max(SEQ_LENS), num_splits=splits,
        block_n=16, workspace=ws,
    )
    assert res is out and not out.isnan().any()
    ref = paged_decode_attention_ref(q, kc, vc, table, lens, scale)
    assert rel_err(out, ref) < TOL[dtype]
    if splits == 3:  # 70 tokens in tiles of 16 -> 3 splits of 32: the combine kernel ran
        assert len(ws) == 1


def test_decode_odd_block_size_many_splits():
    """Block size 5 (not a power of two), more splits than some sequences fill."""
    seq_lens = [3, 5, 41, 64]
    q, kc, vc, table, lens, scale = _case((4, 2, 32), torch.float32, seq_lens, 5, seed=11)
    out = torch.full_like(q, float("nan"))
    paged_decode_attention(q, kc, vc, table, lens, scale, out, num_splits=4, block_n=16)
    ref = paged_decode_attention_ref(q, kc, vc, table, lens, scale)
    assert not out.isnan().any() and rel_err(out, ref) < 1e-3


def test_decode_strided_query():
    """q as a view into a fused qkv projection (token stride > heads * head_dim)."""
    h, kvh, d = 9, 3, 64
    seq_lens = [20, 33]
    _, kc, vc, table, lens, scale = _case((h, kvh, d), torch.float32, seq_lens, 16, seed=12)
    qkv = torch.randn(2, h + 2 * kvh, d)
    q = qkv[:, :h]
    out = paged_decode_attention(q, kc, vc, table, lens, scale, num_splits=2, block_n=16)
    assert rel_err(out, paged_decode_attention_ref(q, kc, vc, table, lens, scale)) < 1e-3


def test_choose_splits_bounds():
    cpu = torch.device("cpu")
    assert choose_splits(256, 8, 128, 64, cpu) == (1, 128)
    n, length = choose_splits(1, 1, 4096, 64, cpu)
    assert 1 < n <= 64 and n * length >= 4096 and length % 64 == 0
    n, length = choose_splits(1, 1, 1, 64, cpu)
    assert n == 1
