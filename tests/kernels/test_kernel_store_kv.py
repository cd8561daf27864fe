"""kernels/store_kv.py against its torch reference."""

import pytest
import torch
from kernel_cases import DTYPES, LAYOUT_IDS, LAYOUTS, make_pool
from servelab_kernels.store_kv import store_kv, store_kv_ref


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_store_kv_matches_reference(layout, dtype):
    _, kvh, d = layout
    gen = torch.Generator().manual_seed(1)
    block_size, num_blocks, num_tokens = 16, 6, 9
    k_cache, v_cache = make_pool(num_blocks, block_size, kvh, d, dtype, gen)
    k = torch.randn((num_tokens, kvh, d), generator=gen).to(dtype)
    v = torch.randn((num_tokens, kvh, d), generator=gen).to(dtype)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[[2, 5]] = -1  # skipped tokens
    slots[0] = num_blocks * block_size - 1  # the pool's very last slot
    kc, vc = k_cache.clone(), v_cache.clone()
    store_kv(kc, vc, k, v, slots)
    kr, vr = k_cache.clone(), v_cache.clone()
    store_kv_ref(kr, vr, k, v, slots)
    assert torch.equal(kc, kr) and torch.equal(vc, vr)


def test_store_kv_strided_input_and_cast():
    """k/v as strided views of a fused qkv tensor, fp32 into a 16-bit pool (one rounding)."""
    gen = torch.Generator().manual_seed(2)
    kvh, d, block_size = 3, 64, 5  # odd block size
    qkv = torch.randn((7, 9 + 2 * kvh, d), generator=gen)
    k, v = qkv[:, 9 : 9 + kvh], qkv[:, 9 + kvh :]
    slots = torch.tensor([0, 4, 5, -1, 13, 29, 12])
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        k_cache, v_cache = make_pool(6, block_size, kvh, d, dtype, gen)
        kc, vc = k_cache.clone(), v_cache.clone()
        store_kv(kc, vc, k, v, slots)
        kr, vr = k_cache.clone(), v_cache.clone()
        store_kv_ref(kr, vr, k, v, slots)
        # the interpreter rounds fp32->bf16 toward zero, torch to nearest: allow one bf16 ulp
        atol = 0 if dtype == torch.float32 else 2**-7 * 4
        torch.testing.assert_close(kc, kr, rtol=2**-7, atol=atol)
        torch.testing.assert_close(vc, vr, rtol=2**-7, atol=atol)
        untouched = torch.ones(6 * block_size, dtype=torch.bool)
        untouched[slots[slots >= 0]] = False
        assert torch.equal(kc.view(-1, kvh, d)[untouched], k_cache.view(-1, kvh, d)[untouched])


def test_store_kv_all_skipped_and_empty():
    gen = torch.Generator().manual_seed(3)
    k_cache, v_cache = make_pool(2, 4, 2, 16, torch.float32, gen)
    kc, vc = k_cache.clone(), v_cache.clone()
    k = torch.randn(3, 2, 16)
    store_kv(kc, vc, k, k, torch.full((3,), -1, dtype=torch.int64))
    store_kv(kc, vc, k[:0], k[:0], torch.empty(0, dtype=torch.int64))
    assert torch.equal(kc, k_cache) and torch.equal(vc, v_cache)
