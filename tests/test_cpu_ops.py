"""The C++ CPU kernels (engine/model/cpu_ops.cpp) compute exactly what the PyTorch code does.

Each kernel replaces 3 to 8 PyTorch operators. They must give the same bits, not merely
close numbers: a greedy engine is compared token for token with transformers, and one
flipped rounding can change a token. So every kernel is checked with `torch.equal` against
its PyTorch twin in llama.py, in each model dtype, at decode and prefill sizes, on the
strided views the forward pass really hands them; then whole engines are compared.

The machine that runs these tests has g++ (CI installs nothing else for it), so the kernels
must build: a failed build fails here instead of silently testing the fallback.
"""

from __future__ import annotations

import pytest
import torch

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.model import cpu_ops
from engine.model.attention import CpuAttention, TorchAttention
from engine.model.llama import apply_rope, rms_norm, silu_mul
from tests.conftest import PROMPTS

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
ROWS = [1, 5, 16, 40]  # decode batches and a prefill chunk (40 x 1536 takes ATen's path)


@pytest.fixture(scope="module")
def ops():
    assert cpu_ops.load(), "the C++ CPU kernels did not build (see the message above)"
    return torch.ops.servelab


def _rand(*shape, dtype, scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", ROWS)
def test_rms_norm_is_bit_identical(ops, dtype, rows):
    # hidden states with a few large outliers, as real residual streams have
    x = _rand(rows, 576, dtype=dtype, scale=2.0)
    x[:, 7] *= 40
    w = _rand(576, dtype=dtype, seed=1)
    assert torch.equal(ops.rms_norm(x, w, 1e-5), rms_norm(x, w, 1e-5))
    # Qwen3's per-head norm: a 3-D strided view of the fused qkv output
    qkv = _rand(rows, 960, dtype=dtype, seed=2)
    heads = qkv[:, :576].view(rows, 9, 64)
    wh = _rand(64, dtype=dtype, seed=3)
    assert torch.equal(ops.rms_norm(heads, wh, 1e-6), rms_norm(heads, wh, 1e-6))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("head_dim", [64, 12])  # 12: not a whole vector, the scalar loop
def test_rope_is_bit_identical(ops, dtype, rows, head_dim):
    qkv = _rand(rows, 15 * head_dim, dtype=dtype, scale=3.0)
    x = qkv[:, :12 * head_dim].view(rows, 12, head_dim)  # q and k heads, rows 15 heads apart
    cos = _rand(rows, 1, head_dim, dtype=dtype, seed=1)
    sin = _rand(rows, 1, head_dim, dtype=dtype, seed=2)
    out = ops.rope(x, cos, sin)
    assert out.is_contiguous() and out.shape == x.shape
    assert torch.equal(out, apply_rope(x, cos, sin))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("inter", [1536, 40])  # 40: a vector loop plus a scalar tail
def test_silu_mul_is_bit_identical(ops, dtype, rows, inter):
    gate_up = _rand(rows, 2 * inter, dtype=dtype, scale=4.0)
    assert torch.equal(ops.silu_mul(gate_up), silu_mul(gate_up))


@pytest.mark.parametrize("dtype", DTYPES)
def test_store_kv_writes_the_same_slots_and_skips_idle_rows(ops, dtype):
    n, kvh, d = 6, 3, 64
    qkv = _rand(n, (9 + 2 * kvh) * d, dtype=dtype)
    k = qkv[:, 9 * d:(9 + kvh) * d].view(n, kvh, d)  # strided views, as in the forward
    v = qkv[:, (9 + kvh) * d:].view(n, kvh, d)
    slots = torch.tensor([5, -1, 17, 0, -1, 63])  # -1: an idle static rider, not stored
    caches = [torch.full((8, 8, kvh, d), 7.0, dtype=dtype) for _ in range(4)]
    TorchAttention().store_kv(caches[0], caches[1], k, v, slots)
    CpuAttention().store_kv(caches[2], caches[3], k, v, slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
    assert (caches[2].view(-1, kvh, d)[1] == 7).all(), "an unlisted slot was written"


def test_bad_inputs_name_what_is_wrong(ops):
    x = torch.randn(2, 8)
    with pytest.raises(RuntimeError, match="weight must have x's last size"):
        ops.rms_norm(x, torch.randn(7), 1e-5)
    with pytest.raises(RuntimeError, match="cos and sin"):
        ops.rope(x.view(2, 2, 4), torch.randn(2, 1, 8), torch.randn(2, 1, 4))
    with pytest.raises(RuntimeError, match="outside the pool"):
        cache = torch.zeros(2, 2, 1, 4)
        ops.store_kv(cache, cache.clone(), x.view(2, 2, 4)[:, :1], x.view(2, 2, 4)[:, 1:],
                     torch.tensor([0, 4]))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_engines_with_and_without_the_kernels_give_the_same_tokens(dtype):
    """Whole engines, batched prefill and decode: identical greedy tokens. Both use the
    torch attention backend: the C++ attention kernel rounds differently from SDPA in bf16
    (tests/test_attention.py checks it); every other kernel must change nothing."""
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    runs = {}
    for kernels in (True, False):
        eng = LLMEngine(EngineConfig(dtype=dtype, cpu_kernels=kernels, max_num_seqs=8,
                                     attention_backend="torch"))
        assert eng.cpu_ops is kernels
        runs[kernels] = [o.token_ids for o in eng.generate(PROMPTS, params)]
    assert runs[True] == runs[False]


def test_off_switch_falls_back_to_pytorch(monkeypatch):
    monkeypatch.setenv("SERVELAB_CPU_OPS", "0")
    cpu_ops.load.cache_clear()
    try:
        assert not cpu_ops.supports(torch.device("cpu"), torch.float32)
    finally:
        monkeypatch.delenv("SERVELAB_CPU_OPS")
        cpu_ops.load.cache_clear()
    assert cpu_ops.supports(torch.device("cpu"), torch.float32)
