"""kernels/extend_attention.py (causal paged prefill / verification) against its torch reference."""

import itertools

import pytest
import torch
from kernel_cases import DTYPES, LAYOUT_IDS, LAYOUTS, TOL, make_pool, random_tables, rel_err
from servelab_kernels.extend_attention import paged_extend_attention, paged_extend_attention_ref

# (query_len, seq_len): a decode row, a whole prompt, a prefill chunk over a cached prefix,
# a speculative-verification row, one query spanning several query blocks
ROWS = [(1, 16), (7, 7), (16, 37), (5, 50), (37, 45)]


def _case(layout, dtype, rows, block_size, seed):
    h, kvh, d = layout
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [n for _, n in rows]
    _, table, num_blocks = random_tables(seq_lens, block_size, gen)
    k_cache, v_cache = make_pool(num_blocks, block_size, kvh, d, dtype, gen)
    qsl = torch.tensor([0, *itertools.accumulate(q for q, _ in rows)], dtype=torch.int32)
    q = torch.randn((int(qsl[-1]), h, d), generator=gen).to(dtype)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    return q, k_cache, v_cache, table, lens, qsl, d**-0.5


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_extend_matches_reference(layout, dtype):
    q, kc, vc, table, lens, qsl, scale = _case(layout, dtype, ROWS, 16, seed=20)
    out = torch.full_like(q, float("nan"))
    res = paged_extend_attention(
        q, kc, vc, table, lens, qsl, scale, out, max_query_len=max(r[0] for r in ROWS),
        block_n=16,
    )
    assert res is out and not out.isnan().any()
    ref = paged_extend_attention_ref(q, kc, vc, table, lens, qsl, scale)
    assert rel_err(out, ref) < TOL[dtype]


def test_extend_speculative_verify_odd_block_size():
    """[last, *draft] rows of k+1 = 5 tokens, block size 3, defaults for the tile sizes."""
    rows = [(5, 5), (5, 12), (5, 29)]
    q, kc, vc, table, lens, qsl, scale = _case((9, 3, 64), torch.float32, rows, 3, seed=21)
    out = torch.full_like(q, float("nan"))
    paged_extend_attention(q, kc, vc, table, lens, qsl, scale, out)
    ref = paged_extend_attention_ref(q, kc, vc, table, lens, qsl, scale)
    assert not out.isnan().any() and rel_err(out, ref) < 1e-3


def test_extend_equals_decode_for_single_tokens():
    """With one query per row the extend kernel reduces to decode attention."""
    from servelab_kernels.decode_attention import paged_decode_attention

    rows = [(1, 1), (1, 16), (1, 23)]
    q, kc, vc, table, lens, qsl, scale = _case((4, 1, 32), torch.float32, rows, 16, seed=22)
    ext = paged_extend_attention(q, kc, vc, table, lens, qsl, scale)
    dec = paged_decode_attention(q, kc, vc, table, lens, scale)
    assert rel_err(ext, dec) < 1e-5


def test_small_head_dim_and_mha():
    """head_dim 8 (below tl.dot's 16: padded lanes) and plain multi-head attention (group 1)."""
    from servelab_kernels.decode_attention import paged_decode_attention, paged_decode_attention_ref

    for layout in ((4, 2, 8), (2, 2, 24)):
        rows = [(1, 9), (6, 21)]
        q, kc, vc, table, lens, qsl, scale = _case(layout, torch.float32, rows, 4, seed=23)
        out = paged_extend_attention(q, kc, vc, table, lens, qsl, scale)
        ref = paged_extend_attention_ref(q, kc, vc, table, lens, qsl, scale)
        assert rel_err(out, ref) < 1e-3
        qd = q[:2]
        out = paged_decode_attention(qd, kc, vc, table, lens, scale, num_splits=2, block_n=16)
        assert rel_err(out, paged_decode_attention_ref(qd, kc, vc, table, lens, scale)) < 1e-3
