"""kernels/warmup.py: the start-up warm-up launches every kernel variant a serving step can.

A variant is what Triton compiles one kernel for: its constexprs, whether each integer argument
is 1, a multiple of 16 or neither, and whether each pointer is 16-byte aligned. The test
records the variants of every launch (the kernels wrapped in a recorder), runs the warm-up, then
serves random steps through the engine's backend within the same limits, and asserts that no
step launched a variant the warm-up had not.
"""

import random

import pytest
import servelab_kernels.decode_attention as dec
import servelab_kernels.extend_attention as ext
import servelab_kernels.store_kv as skv
import torch

from engine.model.attention import build_metadata
from engine.model.attention.triton_backend import TritonAttention
from servelab_kernels import warmup

LAYOUT = (4, 2, 16)  # query heads, KV heads, head dim
BLOCK, MAX_SEQS, MAX_LEN, MAX_Q = 4, 5, 70, 24


def _cls(v):
    if isinstance(v, torch.Tensor):
        return "aligned" if v.data_ptr() % 16 == 0 else "unaligned"
    if isinstance(v, bool) or not isinstance(v, int):
        return type(v).__name__
    return 1 if v == 1 else 16 if v % 16 == 0 else "int"


class Recorder:
    """Stands in for a @triton.jit kernel: records each launch's variant, then launches."""

    def __init__(self, name, kernel, seen):
        self.name, self.kernel, self.seen = name, kernel, seen

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.seen.add((self.name, tuple(map(_cls, args)), tuple(sorted(kwargs.items()))))
            return self.kernel[grid](*args, **kwargs)
        return launch


@pytest.fixture
def recorded(monkeypatch):
    seen = set()
    for mod, name in ((dec, "_decode_split_kernel"), (dec, "_decode_combine_kernel"),
                      (ext, "_extend_kernel"), (skv, "_store_kv_kernel")):
        monkeypatch.setattr(mod, name, Recorder(name, getattr(mod, name), seen))
    return seen


def _random_step(rng):
    """A step the engine could run: decodes only, or a mix with prefill chunks / verifications."""
    n = rng.randint(1, MAX_SEQS)
    decode_only = rng.random() < 0.5
    query_lens, seq_lens = [], []
    for _ in range(n):
        ql = 1 if decode_only else rng.choice([1, 1, 2, 3, 5, rng.randint(1, MAX_Q)])
        seq_lens.append(rng.randint(ql, MAX_LEN))
        query_lens.append(ql)
    if sum(query_lens) > MAX_Q:  # the step's token budget
        return _random_step(rng)
    return query_lens, seq_lens


def test_serving_launches_only_variants_the_warm_up_compiled(recorded):
    h, kvh, d = LAYOUT
    info = warmup.warm_up(h, kvh, d, BLOCK, torch.float32, MAX_SEQS, MAX_LEN, MAX_Q, "cpu")
    assert info["launches"] > 0
    warmed = set(recorded)
    recorded.clear()
    rng = random.Random(5)
    backend = TritonAttention()
    blocks = MAX_SEQS * -(-MAX_LEN // BLOCK)
    k_cache = torch.zeros(blocks, BLOCK, kvh, d)
    v_cache = torch.zeros_like(k_cache)
    for _ in range(40):
        query_lens, seq_lens = _random_step(rng)
        tables, slots, nxt = [], [], 0
        for ql, n in zip(query_lens, seq_lens):
            nb = -(-n // BLOCK)
            tables.append(list(range(nxt, nxt + nb)))
            nxt += nb
            slots += [tables[-1][p // BLOCK] * BLOCK + p % BLOCK for p in range(n - ql, n)]
        meta = build_metadata(query_lens, seq_lens, tables, slots, BLOCK)
        t = sum(query_lens)
        backend.store_kv(k_cache, v_cache, torch.zeros(t, kvh, d), torch.zeros(t, kvh, d), meta)
        backend.forward(torch.zeros(t, h, d), k_cache, v_cache, meta, d**-0.5)
    served = set(recorded)
    assert {v[0] for v in served} >= {"_extend_kernel", "_decode_split_kernel",
                                      "_store_kv_kernel"}
    assert served - warmed == set()


def test_the_plan_reaches_every_split_count_and_block_q():
    dev = torch.device("cpu")
    h, kvh, d = LAYOUT
    p = warmup.plan(h, kvh, d, BLOCK, torch.float32, MAX_SEQS, MAX_LEN, MAX_Q, dev)
    every_len = {dec.choose_splits(n, kvh, L, p["block_n"], dev)[0]
                 for n in range(1, MAX_SEQS + 1) for L in range(1, MAX_LEN + 1)}
    assert p["splits"] == sorted(every_len)
    group = h // kvh
    block_qs = {ext.choose_block_q(q, dec.next_pow2(group)) for q in range(1, MAX_Q + 1)}
    assert {ext.choose_block_q(q, dec.next_pow2(group)) for q in p["query_lens"]} == block_qs
    for need in (1, 2, 15, 16, 17, 40):
        widths = warmup.width_classes(need, 64)
        assert all(w >= need for w in widths)
        assert any(w % 16 == 0 for w in widths) and any(w % 16 and w != 1 for w in widths)
