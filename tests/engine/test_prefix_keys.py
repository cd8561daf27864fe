"""Prefix-cache keys a client cannot collide: a forced collision of Python's hash() (the old
key) hands one request another's KV; the SHA-256 key does not use hash() at all."""

from __future__ import annotations

from engine.config import SamplingParams
from engine.kv import PagedAllocator, paged
from engine.request import Request
from tests.conftest import computed_prompt

BS = 4




def _reuse(monkeypatch, key) -> tuple[int, list[int], list[int]]:
    """Student A's prompt is cached; student B sends other tokens. B's cached tokens, and the
    block tables of both."""
    monkeypatch.setattr(paged, "block_hash", key)
    alloc = PagedAllocator(16, BS, enable_prefix_caching=True)
    a = computed_prompt(alloc, "a", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    b = Request("b", [40, 41, 42, 43, 44, 45, 46, 47, 48], SamplingParams(max_tokens=1))
    alloc.admit(b)
    return b.num_cached_tokens, a.block_table, b.block_table


def test_a_forced_collision_of_the_old_key_shares_kv_across_requests(monkeypatch):
    # Python's hash() made constant (what a crafted collision achieves for one pair)
    monkeypatch.setattr(paged, "hash", lambda _: 0, raising=False)
    # the old key, hash((parent, tokens)), with hash() looked up where the patch is
    cached, a_table, b_table = _reuse(monkeypatch, lambda prev, toks: paged.hash((prev, tuple(
        toks))))
    assert cached == 2 * BS and set(b_table) <= set(a_table)  # B was handed A's KV


def test_the_sha256_key_ignores_python_hash_and_shares_nothing(monkeypatch):
    monkeypatch.setattr(paged, "hash", lambda _: 0, raising=False)
    cached, a_table, b_table = _reuse(monkeypatch, paged.block_hash)
    assert cached == 0 and not set(a_table) & set(b_table)


def test_the_same_prompt_still_hits_and_keys_chain_the_parent():
    alloc = PagedAllocator(16, BS, enable_prefix_caching=True)
    a = computed_prompt(alloc, "a", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    b = Request("b", [1, 2, 3, 4, 5, 6, 7, 8, 10], SamplingParams(max_tokens=1))
    alloc.admit(b)
    assert b.num_cached_tokens == 2 * BS and b.block_table == a.block_table[:2]
    k1 = paged.block_hash(None, [5, 6, 7, 8])
    assert isinstance(k1, bytes) and len(k1) == 32
    # the same tokens under another parent are another block
    assert paged.block_hash(paged.block_hash(None, [1, 2, 3, 4]), [5, 6, 7, 8]) != k1
    assert paged.block_hash(None, [1, 2, 3, 4]) != paged.block_hash(None, [1, 2, 3, 5])
