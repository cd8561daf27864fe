"""The torch attention backend against a naive per-token softmax, through shuffled blocks."""

from __future__ import annotations

import pytest
import torch

from engine.model.attention import TorchAttention, build_metadata


@pytest.mark.parametrize("query_lens, seq_lens", [
    ([1, 1, 1], [1, 4, 9]),  # decode only, context 1 and a full block
    ([1, 3, 20, 1, 5], [7, 9, 25, 1, 5]),  # decodes, drafts, a long prefill chunk, a prompt
    # runs of equal query lengths share one call: two decodes, two verifications, a decode,
    # a whole prompt and a chunk behind cached context, a prompt
    ([1, 1, 3, 3, 1, 20, 20, 5], [5, 12, 9, 17, 1, 20, 30, 5]),
])
def test_matches_naive_attention(query_lens, seq_lens):
    torch.manual_seed(0)
    nb, bs, kvh, d, heads = 40, 4, 3, 16, 9
    kc, vc = torch.randn(nb, bs, kvh, d), torch.randn(nb, bs, kvh, d)
    perm, tables, o = torch.randperm(nb).tolist(), [], 0
    for n in seq_lens:
        m = -(-n // bs)
        tables.append(perm[o:o + m])
        o += m
    q = torch.randn(sum(query_lens), heads, d)
    meta = build_metadata(query_lens, seq_lens, tables, [-1] * len(q), bs)
    out = TorchAttention().forward(q, kc, vc, meta, scale=0.25)
    s = 0
    for ql, n, table in zip(query_lens, seq_lens, tables):
        slots = [table[p // bs] * bs + p % bs for p in range(n)]
        k = kc.view(-1, kvh, d)[slots].repeat_interleave(heads // kvh, 1)  # [n, H, d]
        v = vc.view(-1, kvh, d)[slots].repeat_interleave(heads // kvh, 1)
        for i in range(ql):
            pos = n - ql + i  # query i sits after the cached context
            att = torch.einsum("hd,nhd->hn", q[s + i], k[:pos + 1]) * 0.25
            ref = torch.einsum("hn,nhd->hd", att.softmax(-1), v[:pos + 1])
            torch.testing.assert_close(out[s + i], ref, atol=1e-5, rtol=1e-4)
        s += ql


def test_rows_of_equal_query_length_share_a_segment():
    meta = build_metadata([1, 1, 3, 3, 1, 20, 20, 5], [5, 12, 9, 17, 1, 20, 30, 5],
                          [[0, 1, 2, 3, 4, 5, 6, 7]] * 8, [-1] * 54, 4)
    plan = TorchAttention()._plan(meta, torch.float32)
    assert [(start, rows, m) for start, rows, m, _, _ in plan] == [
        (0, 2, 1), (2, 2, 3), (8, 1, 1), (9, 2, 20), (49, 1, 5)]


def test_store_skips_minus_one():
    kc, vc = torch.zeros(2, 2, 1, 2), torch.zeros(2, 2, 1, 2)
    k = torch.ones(3, 1, 2)
    TorchAttention().store_kv(kc, vc, k, 2 * k, torch.tensor([3, -1, 0]))
    assert kc.view(-1, 2)[:, 0].tolist() == [1, 0, 0, 1]
    assert vc.view(-1, 2)[:, 0].tolist() == [2, 0, 0, 2]
