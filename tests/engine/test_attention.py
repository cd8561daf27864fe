"""The torch and cpu attention backends against a naive per-token softmax, through shuffled
blocks. The cpu backend runs every request in the C++ kernel (engine/model/cpu/ops.cpp), the
whole step in one call, when the head dim is 64 or 128, and other head shapes with SDPA, so
these cases cover both paths. tests/engine/test_batch_invariance.py holds the kernel's rows to the
same bits whatever shares the call."""

from __future__ import annotations

import pytest
import torch

from engine.model.attention import TorchAttention, build_metadata, get_backend
from engine.model.cpu import library as cpu_library
from engine.model.cpu.attention import CpuAttention

BACKENDS = {"torch": TorchAttention, "cpu": CpuAttention}


@pytest.mark.parametrize("query_lens, seq_lens", [
    ([1, 1, 1], [1, 4, 9]),  # decode only, context 1 and a full block
    ([1, 3, 20, 1, 5], [7, 9, 25, 1, 5]),  # decodes, drafts, a long prefill chunk, a prompt
    # runs of equal query lengths share one call: two decodes, two verifications, a decode,
    # a whole prompt and a chunk behind cached context, a prompt
    ([1, 1, 3, 3, 1, 20, 20, 5], [5, 12, 9, 17, 1, 20, 30, 5]),
    ([1, 1, 1, 1], [3, 70, 16, 33]),  # decode only: one kernel call for the whole step
    # a chunk of 70 queries beside decodes and drafts: one kernel call takes them all
    ([1, 3, 70, 1], [7, 9, 80, 5]),
])
@pytest.mark.parametrize("backend", ["torch", "cpu"])
@pytest.mark.parametrize("d", [16, 64, 128, 20])  # cpu: 64, 128 in the kernel; 16, 20 via SDPA
def test_matches_naive_attention(query_lens, seq_lens, backend, d):
    _check_naive(query_lens, seq_lens, backend, d, heads=9, kvh=3)


# the C++ kernel has one instance per query heads per KV head (1-8): each against the naive
@pytest.mark.parametrize("heads, kvh", [(3, 3), (4, 2), (9, 3), (8, 2), (10, 2), (12, 2),
                                        (14, 2), (16, 2)])
def test_every_group_size_matches_naive_attention(heads, kvh):
    _check_naive([1, 3, 20, 1], [7, 9, 25, 300], "cpu", 64, heads=heads, kvh=kvh)


def _check_naive(query_lens, seq_lens, backend, d, heads, kvh):
    if backend == "cpu":
        assert cpu_library.load()
    torch.manual_seed(0)
    bs = 4
    nb = max(60, sum(-(-n // bs) for n in seq_lens))
    kc, vc = torch.randn(nb, bs, kvh, d), torch.randn(nb, bs, kvh, d)
    perm, tables, o = torch.randperm(nb).tolist(), [], 0
    for n in seq_lens:
        m = -(-n // bs)
        tables.append(perm[o:o + m])
        o += m
    q = torch.randn(sum(query_lens), heads, d)
    meta = build_metadata(query_lens, seq_lens, tables, [-1] * len(q), bs)
    out = BACKENDS[backend]().forward(q, kc, vc, meta, scale=0.25)
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


def _naive(q, kc, vc, table, n, ql, bs, scale):
    """Exact softmax attention, in float64, for the ql queries that end a context of n."""
    kvh, d = kc.shape[2], kc.shape[3]
    heads = q.shape[1]
    slots = [table[p // bs] * bs + p % bs for p in range(n)]
    k = kc.view(-1, kvh, d)[slots].double().repeat_interleave(heads // kvh, 1)
    v = vc.view(-1, kvh, d)[slots].double().repeat_interleave(heads // kvh, 1)
    out = []
    for i in range(ql):
        pos = n - ql + i
        att = torch.einsum("hd,nhd->hn", q[i].double(), k[:pos + 1]) * scale
        out.append(torch.einsum("hn,nhd->hd", att.softmax(-1), v[:pos + 1]))
    return torch.stack(out)


# a context longer than the kernel's chunk (256 by default) is split into equal parts, one
# task each, joined in order: any chunk size gives exact attention, within fp32 rounding;
# contexts up to the chunk keep their bits
@pytest.mark.parametrize("chunk", [0, 1, 7, 100, 256])
@pytest.mark.parametrize("query_lens, seq_lens", [
    ([1], [600]),  # one decode at a long context: 3 parts of 200
    ([1, 1, 1], [257, 513, 40]),  # decodes just past one and two chunks, and a short one
    ([40, 3], [300, 700]),  # a prefill chunk crossing the split at 256, a verification
])
def test_kernel_splits_long_contexts_exactly(chunk, query_lens, seq_lens):
    assert cpu_library.load()
    torch.manual_seed(1)
    bs, kvh, heads, d, scale = 16, 3, 9, 64, 0.125
    nb = sum(-(-n // bs) for n in seq_lens) + 2
    kc, vc = torch.randn(nb, bs, kvh, d), torch.randn(nb, bs, kvh, d)
    perm, tables, o = torch.randperm(nb).tolist(), [], 0
    for n in seq_lens:
        tables.append(perm[o:o + -(-n // bs)])
        o += len(tables[-1])
    q = torch.randn(sum(query_lens), heads, d)
    meta = build_metadata(query_lens, seq_lens, tables, [-1] * len(q), bs)
    args = (q, kc, vc, meta.block_tables, meta.seq_lens, meta.query_start_loc, scale)
    out = torch.ops.servelab.paged_attention(*args, chunk)
    whole = torch.ops.servelab.paged_attention(*args, 0)  # every context in one task
    s = 0
    for ql, n, table in zip(query_lens, seq_lens, tables):
        ref = _naive(q[s:s + ql], kc, vc, table, n, ql, bs, scale)
        torch.testing.assert_close(out[s:s + ql].double(), ref, atol=2e-6, rtol=1e-5)
        for i in range(ql):  # a context no longer than the chunk: the unsplit bits
            if n - ql + i + 1 <= max(chunk, 1) or chunk == 0:
                assert torch.equal(out[s + i], whole[s + i])
        s += ql
    if chunk == 256:  # the default, which CpuAttention uses
        assert torch.equal(CpuAttention().forward(q, kc, vc, meta, scale), out)
    if chunk:  # the split changes some bits past the chunk (a skipped split would not)
        assert not torch.equal(out, whole)


def test_kernel_bounds_the_partials_of_long_prompts():
    """A prompt whose split partials would outgrow the kernel's 16 MB budget (here 100
    queries at contexts ~700-800 split every 4 positions: ~11M floats) works through each
    query's parts inside its own task instead: the same bits as each row decoded alone, whose
    parts are tasks of their own."""
    assert cpu_library.load()
    torch.manual_seed(2)
    bs, kvh, heads, d, n, m, chunk = 16, 3, 9, 64, 800, 100, 4
    assert sum(-(-(n - m + i + 1) // chunk) for i in range(m)) * heads * (d + 2) > 4 << 20
    nb = -(-n // bs)
    kc, vc = torch.randn(nb, bs, kvh, d), torch.randn(nb, bs, kvh, d)
    table = torch.randperm(nb).tolist()
    q = torch.randn(m, heads, d)

    def attention(rows, ctx):
        meta = build_metadata([len(rows)], [ctx], [table], [-1] * len(rows), bs)
        return torch.ops.servelab.paged_attention(rows, kc, vc, meta.block_tables,
                                                  meta.seq_lens, meta.query_start_loc, 0.125,
                                                  chunk)

    out = attention(q, n)
    for i in range(0, m, 9):
        assert torch.equal(attention(q[i:i + 1], n - m + i + 1)[0], out[i]), f"query {i}"
    torch.testing.assert_close(out[-1:].double(), _naive(q[-1:], kc, vc, table, n, 1, bs, 0.125),
                               atol=2e-6, rtol=1e-5)


def test_rows_of_equal_query_length_share_a_segment():
    meta = build_metadata([1, 1, 3, 3, 1, 20, 20, 5], [5, 12, 9, 17, 1, 20, 30, 5],
                          [[0, 1, 2, 3, 4, 5, 6, 7]] * 8, [-1] * 54, 4)
    plan = TorchAttention()._plan(meta, torch.float32)
    assert [(start, rows, m) for start, rows, m, _, _ in plan] == [
        (0, 2, 1), (2, 2, 3), (8, 1, 1), (9, 2, 20), (49, 1, 5)]


def test_store_skips_minus_one():
    kc, vc = torch.zeros(2, 2, 1, 2), torch.zeros(2, 2, 1, 2)
    k = torch.ones(3, 1, 2)
    meta = build_metadata([3], [3], [[0]], [3, -1, 0], 2)
    assert meta.stored_rows.tolist() == [0, 2]  # known when the step is built, not per layer
    TorchAttention().store_kv(kc, vc, k, 2 * k, meta)
    assert kc.view(-1, 2)[:, 0].tolist() == [1, 0, 0, 1]
    assert vc.view(-1, 2)[:, 0].tolist() == [2, 0, 0, 2]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cpu_kernel_in_half_precision_matches_fp32_softmax(dtype):
    """In bf16/fp16 the kernel keeps scores, softmax and the V sum in float and rounds once,
    so it lands within one rounding of the exact fp32 answer (SDPA, which rounds the
    probabilities first, is allowed two)."""
    assert cpu_library.load()
    torch.manual_seed(1)
    nb, bs, kvh, d, heads = 30, 8, 3, 64, 9
    kc, vc = torch.randn(nb, bs, kvh, d), torch.randn(nb, bs, kvh, d)
    tables = [list(range(0, 10)), list(range(10, 30))]
    meta = build_metadata([1, 1], [77, 160], tables, [-1, -1], bs)
    q = torch.randn(2, heads, d)
    exact = TorchAttention().forward(q, kc, vc, meta, scale=0.125)
    meta._cache.clear()
    half = CpuAttention().forward(q.to(dtype), kc.to(dtype), vc.to(dtype), meta, scale=0.125)
    eps = torch.finfo(dtype).eps
    # inputs rounded to the dtype move the exact answer by a few eps; the kernel adds one
    torch.testing.assert_close(half.float(), exact, atol=8 * eps, rtol=8 * eps)


@pytest.mark.parametrize("cache_dtype", [torch.float16, torch.bfloat16])
def test_a_16_bit_cache_of_fp32_queries_is_the_fp32_kernel_on_its_numbers(cache_dtype):
    """The plan's kv_dtype: fp32 activations, K and V stored in 16 bits. Storing rounds each
    number to nearest even, as Tensor.to does; attention reads the 16-bit numbers into float
    exactly, so its output has the bits of the fp32 kernel run on the same numbers widened,
    for decodes, drafts, chunks and split long contexts alike (the split is a function of the
    context only)."""
    assert cpu_library.load()
    torch.manual_seed(2)
    bs, kvh, d, heads = 8, 3, 64, 9
    query_lens, seq_lens = [1, 3, 40, 1], [7, 300, 60, 520]
    tables, nb = [], 0
    for n in seq_lens:
        tables.append(list(range(nb, nb + -(-n // bs))))
        nb += len(tables[-1])
    order = torch.randperm(nb)  # the blocks anywhere in the pool
    tables = [[int(order[b]) for b in t] for t in tables]
    slots = [t[p // bs] * bs + p % bs for t, n in zip(tables, seq_lens) for p in range(n)]
    k, v = torch.randn(len(slots), kvh, d), torch.randn(len(slots), kvh, d)
    caches = torch.zeros(2, nb, bs, kvh, d, dtype=cache_dtype)
    store = build_metadata([len(slots)], [len(slots)], [list(range(nb))], slots, bs)
    CpuAttention().store_kv(caches[0], caches[1], k, v, store)
    flat = caches.view(2, -1, kvh, d)
    assert torch.equal(flat[0, slots], k.to(cache_dtype))
    assert torch.equal(flat[1, slots], v.to(cache_dtype))
    meta = build_metadata(query_lens, seq_lens, tables, [-1] * sum(query_lens), bs)
    q = torch.randn(sum(query_lens), heads, d)
    mixed = CpuAttention().forward(q, caches[0], caches[1], meta, scale=0.125)
    assert mixed.dtype == torch.float32
    meta._cache.clear()
    wide = CpuAttention().forward(q, caches[0].float(), caches[1].float(), meta, scale=0.125)
    assert torch.equal(mixed, wide)
    meta._cache.clear()  # the torch backend widens the gathered blocks: the same answer
    sdpa = TorchAttention().forward(q, caches[0], caches[1], meta, scale=0.125)
    torch.testing.assert_close(sdpa, mixed, atol=1e-5, rtol=1e-5)


def test_the_kernels_refuse_a_cache_they_cannot_read():
    """Only fp32 activations may have a cache of another (16-bit) dtype."""
    assert cpu_library.load()
    kc = torch.zeros(4, 4, 1, 64, dtype=torch.float16)
    starts, table = torch.tensor([0, 1], dtype=torch.int32), torch.zeros(1, 1, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="a Half KV cache with BFloat16 activations"):
        torch.ops.servelab.paged_attention(torch.zeros(1, 1, 64, dtype=torch.bfloat16), kc, kc,
                                           table, torch.tensor([1]), starts, 1.0)
    with pytest.raises(RuntimeError, match="a Float KV cache with Half activations"):
        torch.ops.servelab.store_kv(kc.float(), kc.float(), torch.zeros(1, 1, 64,
                                    dtype=torch.float16), torch.zeros(1, 1, 64,
                                    dtype=torch.float16), torch.tensor([0]))


def test_cpu_kernel_rejects_a_table_too_short():
    assert cpu_library.load()
    kc = torch.zeros(4, 4, 1, 64)
    starts = torch.tensor([0, 1], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="does not fit its block table"):
        torch.ops.servelab.paged_attention(torch.zeros(1, 1, 64), kc, kc, torch.zeros(1, 1,
                                           dtype=torch.int32), torch.tensor([5]), starts, 1.0)
    with pytest.raises(RuntimeError, match="brings 2 queries with a context of 1"):
        torch.ops.servelab.paged_attention(torch.zeros(2, 1, 64), kc, kc,
                                           torch.zeros(1, 1, dtype=torch.int32),
                                           torch.tensor([1]), torch.tensor([0, 2]), 1.0)
    with pytest.raises(RuntimeError, match="head dim must be 64 or 128"):
        torch.ops.servelab.paged_attention(torch.zeros(1, 1, 8), kc[..., :8].contiguous(),
                                           kc[..., :8].contiguous(),
                                           torch.zeros(1, 1, dtype=torch.int32),
                                           torch.tensor([1]), starts, 1.0)


def test_metadata_from_ragged_tables():
    meta = build_metadata([2, 1, 3], [5, 1, 9], [[4, 7], [2], [0, 3, 5]], [0] * 6, 4)
    assert meta.query_start_loc.tolist() == [0, 2, 3, 6]
    assert meta.seq_lens.tolist() == [5, 1, 9]
    assert meta.block_tables.tolist() == [[4, 7, 0], [2, 0, 0], [0, 3, 5]]
    assert meta.stored_rows is None  # every row stores: no filtering
    assert build_metadata([], [], [], [], 4).block_tables.shape == (0, 1)


class _PinnedStandIn:
    """build_step's CUDA branch (fill a reused host buffer, then one copy) on the CPU."""

    device = torch.device("cuda")

    def host(self, n):
        import numpy as np

        self.buf = np.full(n, 7, np.int32)  # stale bytes: everything must be overwritten
        return self.buf

    def send(self):
        return torch.from_numpy(self.buf.copy())


@pytest.mark.parametrize("staging", [None, _PinnedStandIn()], ids=["cpu", "pinned-branch"])
def test_step_buffer_holds_every_array(staging):
    """The step's one int32 buffer, both ways it is filled: the int64 arrays (slots with a
    skipped row, token ids, positions, logit rows; as lists, a tensor and a NumPy array),
    the stored rows, the query starts, the context lengths and the zero-padded tables."""
    import numpy as np

    from engine.model.attention import build_step

    meta, (ids, pos, rows) = build_step(
        [2, 1, 3], [5, 1, 9], [[4, 7], [2], [0, 3, 5]], [8, 9, -1, 12, 2**33, 14], 4, "cpu",
        ([101, 102, 103, 104, 105, 106], torch.tensor([3, 4, 0, 6, 7, 8]), np.array([1, 2, 5])),
        staging)
    assert meta.slot_mapping.tolist() == [8, 9, -1, 12, 2**33, 14]
    assert meta.slot_mapping.dtype == torch.int64 and ids.dtype == torch.int64
    assert ids.tolist() == [101, 102, 103, 104, 105, 106]
    assert pos.tolist() == [3, 4, 0, 6, 7, 8] and rows.tolist() == [1, 2, 5]
    assert meta.stored_rows.tolist() == [0, 1, 3, 4, 5]
    assert meta.query_start_loc.tolist() == [0, 2, 3, 6]
    assert meta.seq_lens.tolist() == [5, 1, 9]
    assert meta.block_tables.tolist() == [[4, 7, 0], [2, 0, 0], [0, 3, 5]]


@pytest.mark.parametrize("staging", [None, _PinnedStandIn()], ids=["cpu", "pinned-branch"])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("skip", [False, True])
def test_every_array_in_the_step_buffer_starts_16_byte_aligned(staging, n, skip):
    """Triton specializes a kernel on whether each pointer is 16-byte aligned: offsets that
    moved with the batch would compile new kernel variants while serving (a 0.3-0.5 s stall a
    compile on a GPU). Whatever the number of requests, tokens and skipped rows, every array
    starts a multiple of 16 bytes from the buffer's start (slot_mapping, at 0)."""
    from engine.model.attention import build_step

    query_lens = [1 + (i % 3) for i in range(n)]
    tokens = sum(query_lens)
    slots = [-1 if skip and i == 0 else 100 + i for i in range(tokens)]
    tables = [list(range(1 + i % 2)) for i in range(n)]
    meta, arrays = build_step(query_lens, [q + 4 for q in query_lens], tables, slots, 4, "cpu",
                              (list(range(tokens)), list(range(tokens)), [0] * (n + 1)),
                              staging)
    base = meta.slot_mapping.data_ptr()
    tensors = [meta.query_start_loc, meta.seq_lens, meta.block_tables, *arrays]
    tensors += [meta.stored_rows] if skip else []
    assert [(t.data_ptr() - base) % 16 for t in tensors] == [0] * len(tensors)
    assert meta.seq_lens.tolist() == [q + 4 for q in query_lens]
    assert meta.block_tables[:, 0].tolist() == [0] * n and arrays[2].tolist() == [0] * (n + 1)
    if skip:
        assert meta.stored_rows.tolist() == list(range(1, tokens))


def test_backends_by_name():
    assert isinstance(get_backend("torch"), TorchAttention)
    assert cpu_library.load() and isinstance(get_backend("cpu"), CpuAttention)
    with pytest.raises(ValueError, match="attention_backend must be one of"):
        get_backend("flash")
