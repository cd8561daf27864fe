"""Allocator and scheduler invariants under random admit/append/finish/preempt sequences."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.config import SamplingParams
from engine.kv import ContiguousAllocator, PagedAllocator
from engine.request import Request
from tests.conftest import assert_blocks_consistent


def reference_block_map(alloc, holders) -> list[dict]:
    """The KV map written out plainly: each held block's owners, the most tokens any owner
    has written into it, its state; then the prefix cache's unheld blocks; in block order."""
    bs, views = alloc.block_size, {}
    for r in holders:
        for i, b in enumerate(r.block_table):
            v = views.setdefault(b, {"block": b, "owners": [], "tokens": 0})
            v["owners"].append(r.request_id)
            v["tokens"] = max(v["tokens"], min(bs, max(0, r.num_computed_tokens - i * bs)))
    for v in views.values():
        v["state"] = ("shared" if len(v["owners"]) > 1 else
                      "reserved" if v["tokens"] == 0 else "used")
    for b in alloc.cached_blocks():
        views.setdefault(b, {"block": b, "owners": [], "tokens": 0, "state": "cached"})
    return [views[b] for b in sorted(views)]


ops = st.lists(st.tuples(st.sampled_from(["admit", "grow", "finish", "preempt", "truncate"]),
                         st.integers(0, 7), st.integers(1, 40)), max_size=80)


@settings(max_examples=150, deadline=None)
@given(ops=ops, caching=st.booleans(), layout=st.sampled_from(["paged", "contiguous"]))
def test_random_sequences_never_double_own_or_leak(ops, caching, layout):
    bs = 4
    if layout == "paged":
        alloc = PagedAllocator(24, bs, enable_prefix_caching=caching)
    else:
        alloc = ContiguousAllocator(24, bs, max_model_len=20)
    live: dict[int, Request] = {}
    shared_prompt = [7, 7, 7, 7, 8, 8, 8, 8, 9]
    for op, i, n in ops:
        req = live.get(i)
        if op == "admit" and req is None:
            r = Request(f"r{i}", shared_prompt + [i] * (n % 5 + 1), SamplingParams())
            if alloc.admit(r) and alloc.ensure_slots(r, r.num_tokens):
                r.num_computed_tokens = r.num_tokens
                alloc.on_computed(r)
                live[i] = r
            else:
                alloc.free(r)
        elif op == "grow" and req is not None:
            target = min(req.num_tokens + n % 6, 20)
            if alloc.ensure_slots(req, target):
                req.output_token_ids += [1] * (target - req.num_tokens)
                req.num_computed_tokens = req.num_tokens
                alloc.on_computed(req)
        elif op == "truncate" and req is not None:
            keep = max(1, req.num_computed_tokens - n % 5)
            alloc.truncate(req, keep)
            req.num_computed_tokens = min(req.num_computed_tokens, keep)
            del req.output_token_ids[max(0, keep - req.num_prompt_tokens):]
        elif op in ("finish", "preempt") and req is not None:
            alloc.free(req)
            del live[i]
        assert_blocks_consistent(alloc, live.values())
        assert alloc.block_map(list(live.values())) == reference_block_map(alloc, live.values())
    for r in list(live.values()):
        alloc.free(r)
    assert_blocks_consistent(alloc, [])
    assert alloc.num_free_blocks == alloc.num_blocks


def test_contiguous_first_fit():
    alloc = ContiguousAllocator(10, 4, max_model_len=12)  # 3 blocks per request
    a, b, c, d = (Request(x, [1, 2], SamplingParams()) for x in "abcd")
    assert alloc.admit(a) and a.block_table == [0, 1, 2]
    assert alloc.admit(b) and b.block_table == [3, 4, 5]
    assert alloc.admit(c) and c.block_table == [6, 7, 8]
    alloc.free(b)
    assert alloc.admit(d) and d.block_table == [3, 4, 5], "first fit reuses the first hole"


def test_contiguous_external_fragmentation_makes_a_request_wait():
    alloc = ContiguousAllocator(10, 4, max_model_len=16)  # 4 blocks for a default request
    a, b, c, w = (Request(x, [1], SamplingParams()) for x in "abcw")
    for r in (a, b):
        assert alloc.admit(r)  # a: 0-3, b: 4-7
    alloc.free(a)  # free: 0-3 and 8-9
    assert alloc.admit(c) and c.block_table == [0, 1, 2, 3]
    alloc.free(b)  # free: 4-9 (6 blocks, one run)
    assert alloc.largest_free_run() == 6
    # a 2-block and a 1-block tenant, then the first leaves: holes of 2 and 3 blocks
    s1 = Request("s1", [1], SamplingParams(max_tokens=7))  # 8 tokens: 2 blocks, 4-5
    p = Request("p", [1], SamplingParams(max_tokens=3))  # 4 tokens: 1 block, 6
    assert alloc.admit(s1) and alloc.admit(p) and p.block_table == [6]
    alloc.free(s1)
    x = Request("x", [1], SamplingParams())
    assert alloc.num_free_blocks == 5 and alloc.largest_free_run() == 3
    assert not alloc.admit(x), "5 blocks free in total, but no run of 4"
    assert "external fragmentation" in alloc.last_refusal
    assert not x.block_table
    alloc.free(p)
    assert alloc.admit(w) and w.block_table == [4, 5, 6, 7]


def test_cuda_pool_serves_the_configuration_not_the_whole_card(monkeypatch):
    """On CUDA with no num_kv_blocks, the pool is what the seats need at full length (times
    the headroom), capped by gpu_memory_utilization of the free memory; never half the card."""
    import torch

    from engine import EngineConfig
    from engine.kv import KVPool
    from engine.model.loader import ModelConfig
    from engine.runner import CUDA_KV_HEADROOM, num_kv_blocks

    mc = ModelConfig.from_hf({"architectures": ["LlamaForCausalLM"], "vocab_size": 100,
                              "hidden_size": 576, "intermediate_size": 1536,
                              "num_hidden_layers": 30, "num_attention_heads": 9,
                              "num_key_value_heads": 3, "rms_norm_eps": 1e-5})
    cuda = torch.device("cuda")
    per_block = KVPool.bytes_per_block(30, 16, 3, 64, torch.bfloat16)
    cfg = EngineConfig(max_num_seqs=8, max_model_len=512, block_size=16)
    big_card = 140 * 2**30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (big_card, big_card))
    assert CUDA_KV_HEADROOM == 2
    # not ~ free / 2 / per_block
    assert num_kv_blocks(cfg, mc, torch.bfloat16, cuda) == 8 * 32 * 2
    small = 100 * per_block
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (small, small))
    # capped by gpu_memory_utilization=0.5
    assert num_kv_blocks(cfg, mc, torch.bfloat16, cuda) == 50
    given = EngineConfig(max_num_seqs=8, max_model_len=512, block_size=16, num_kv_blocks=77)
    assert num_kv_blocks(given, mc, torch.bfloat16, cuda) == 77
    tiny = 40 * per_block  # 20 blocks: not one request of 512 tokens (32 blocks)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (tiny, tiny))
    with pytest.raises(ValueError, match="num_kv_blocks=20 is too small"):
        num_kv_blocks(cfg, mc, torch.bfloat16, cuda)


def test_kv_summary_lists_the_blocks_in_use_whatever_the_pool():
    """A pool of 100,000 blocks with four requests: the KV map and its free-run figure come
    from the blocks in use (nothing in the summary walks the pool)."""
    from engine.report import kv_summary

    for alloc in (PagedAllocator(100_000, 16), ContiguousAllocator(100_000, 16, 256)):
        reqs = [Request(f"r{i}", list(range(40 + i)), SamplingParams(max_tokens=30))
                for i in range(4)]
        for r in reqs:
            assert alloc.admit(r) and alloc.ensure_slots(r, r.num_tokens)
            r.num_computed_tokens = r.num_tokens
        kv = kv_summary(alloc, reqs)
        held = {b for r in reqs for b in r.block_table}
        assert [b["block"] for b in kv.blocks] == sorted(held)
        assert kv.free_blocks == 100_000 - len(held)
        assert kv.largest_free_run == 100_000 - len(held)  # the used blocks come first
        for r in reqs:
            alloc.free(r)
        assert alloc.num_free_blocks == 100_000
