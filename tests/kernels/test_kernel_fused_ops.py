"""kernels/fused_ops.py against the engine's torch ops (engine/model/llama.py), which are the
references: fp32 within a tight tolerance (RoPE to the bit).

bf16: Triton's interpreter converts fp32 to bf16 by dropping the low bits (truncation), where
torch and a GPU round to nearest, so under the interpreter each rounding may land one unit lower:
bf16 is held to two units here, and `test_bf16_rounds_where_torch_rounds` shows the kernel rounds
at exactly torch's points (equal bits against the same sequence with truncation). On a GPU,
`python -m benchmarks.gpu.check` compares bf16 bit for bit."""

import pytest
import torch
from servelab_kernels.fused_ops import add_rms_norm, rms_norm, rope, silu_mul

from engine.model import llama

# SmolLM2-135M's sizes (hidden 576, 9 q + 3 kv heads of 64, MLP 1536) and a power-of-two set
SHAPES = [dict(hidden=576, hq=9, hkv=3, d=64, inter=1536), dict(hidden=512, hq=8, hkv=2, d=128,
                                                                 inter=1024)]
IDS = ["smollm2", "pow2"]
FP32 = dict(rtol=1e-5, atol=1e-6)


def close(got, want, dtype):
    if dtype == torch.float32:
        return torch.allclose(got, want, **FP32)
    # bf16 under the interpreter: two units in the last place of the larger term (RoPE's sum
    # of two truncated products may cancel, so the bound is absolute at the inputs' scale)
    return torch.allclose(got.float(), want.float(), rtol=2 ** -6, atol=2 ** -4)


def rope_tables(n, d, gen, dtype):
    pos = torch.randint(0, 4096, (n,), generator=gen)
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    emb = torch.cat([torch.outer(pos.float(), inv)] * 2, dim=-1)
    sin = emb.sin()
    sin[:, : d // 2] *= -1
    return emb.cos().to(dtype).unsqueeze(1), sin.to(dtype).unsqueeze(1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
def test_rms_norm_and_add_rms_norm_match_the_engines_ops(shape, dtype):
    gen = torch.Generator().manual_seed(0)
    n, hidden, eps = 7, shape["hidden"], 1e-5
    h = (torch.randn((n, hidden), generator=gen) * 3).to(dtype)
    delta = torch.randn((n, hidden), generator=gen).to(dtype)
    w = (1 + 0.1 * torch.randn(hidden, generator=gen)).to(dtype)
    got, want = rms_norm(h, w, eps), llama.rms_norm(h, w, eps)
    assert got.dtype == dtype and got.shape == want.shape and close(got, want, dtype)
    s, x = add_rms_norm(h, delta, w, eps)
    s_ref, x_ref = llama.add_rms_norm(h, delta, w, eps)
    if dtype == torch.float32:  # one addition: the same bits
        assert torch.equal(s, s_ref)
    else:  # one truncating rounding under the interpreter
        assert torch.equal(s.float(), trunc_bf16(h.float() + delta.float()))
        x_ref = llama.rms_norm(s, w, eps)  # the norm of that sum
    assert close(x, x_ref, dtype)
    # per-head (Qwen3's q/k norm): a strided [tokens, heads, d] view of the fused qkv rows
    d = shape["d"]
    qkv = torch.randn((n, (shape["hq"] + 2 * shape["hkv"]) * d), generator=gen).to(dtype)
    q = qkv[:, : shape["hq"] * d].view(n, shape["hq"], d)
    wq = (1 + 0.1 * torch.randn(d, generator=gen)).to(dtype)
    got = rms_norm(q, wq, eps)
    assert got.shape == q.shape and close(got, llama.rms_norm(q, wq, eps), dtype)
    assert rms_norm(h[:0], w, eps).shape == (0, hidden)  # an empty step launches nothing


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
def test_rope_matches_the_engines_op_on_the_fused_qkv_view(shape, dtype):
    gen = torch.Generator().manual_seed(1)
    n, hq, hkv, d = 5, shape["hq"], shape["hkv"], shape["d"]
    qkv = torch.randn((n, (hq + 2 * hkv) * d), generator=gen).to(dtype)
    qk = qkv[:, : (hq + hkv) * d].view(n, hq + hkv, d)  # as LlamaModel.forward rotates it
    cos, sin = rope_tables(n, d, gen, dtype)
    got, want = rope(qk, cos, sin), llama.apply_rope(qk, cos, sin)
    assert got.shape == want.shape and got.dtype == dtype
    assert close(got, want, dtype)
    if dtype == torch.float32:  # the products and their sum, unfused, are torch's exactly
        assert torch.equal(got, want)
    # the rotation does something: the output is not the input
    assert not torch.allclose(got, qk.contiguous())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("inter", [1536, 3000], ids=["smollm2", "odd-width"])
def test_silu_mul_matches_the_engines_op(inter, dtype):
    gen = torch.Generator().manual_seed(2)
    gate_up = (torch.randn((6, 2 * inter), generator=gen) * 4).to(dtype)
    got, want = silu_mul(gate_up), llama.silu_mul(gate_up)
    assert got.shape == (6, inter) and got.dtype == dtype
    assert close(got, want, dtype)
    with pytest.raises(ValueError, match="odd"):
        silu_mul(gate_up[:, :-1])


def test_one_layer_with_the_fused_ops_matches_the_torch_ops():
    """A whole layer's small ops, chained as LlamaModel.forward chains them, in fp32."""
    gen = torch.Generator().manual_seed(3)
    n, hidden, hq, hkv, d, inter, eps = 4, 576, 9, 3, 64, 1536, 1e-5
    ops, ref = llama.triton_ops(), llama.TORCH_OPS
    assert ops.name == "triton" and ops._fields == ref._fields
    h = torch.randn((n, hidden), generator=gen)
    w_in, w_post = 1 + 0.1 * torch.randn(hidden, generator=gen), torch.rand(hidden, generator=gen)
    wqkv = torch.randn(((hq + 2 * hkv) * d, hidden), generator=gen) / hidden ** 0.5
    wgu = torch.randn((2 * inter, hidden), generator=gen) / hidden ** 0.5
    wd = torch.randn((hidden, inter), generator=gen) / inter ** 0.5
    cos, sin = rope_tables(n, d, gen, torch.float32)

    def layer(o):
        x = o.rms_norm(h, w_in, eps)
        qkv = x @ wqkv.T
        qk = o.rope(qkv[:, : (hq + hkv) * d].view(n, hq + hkv, d), cos, sin)
        h2, x2 = o.add_rms_norm(h, qk[:, :hidden // d].reshape(n, hidden), w_post, eps)
        return o.add_rms_norm(h2, o.silu_mul(x2 @ wgu.T) @ wd.T, w_in, eps)

    (a, b), (c, e) = layer(ops), layer(ref)
    assert torch.allclose(a, c, **FP32) and torch.allclose(b, e, **FP32)


def trunc_bf16(t: torch.Tensor) -> torch.Tensor:
    """fp32 -> bf16 as the interpreter converts (the low 16 bits dropped), kept in fp32."""
    return (t.float().view(torch.int32) & ~0xFFFF).view(torch.float32)


def test_bf16_rounds_where_torch_rounds():
    """The torch ops' bf16 sequence with the interpreter's rounding gives the kernels' bits:
    the kernels round at the same points, so on a GPU (round to nearest) they are torch's."""
    import torch.nn.functional as F

    gen = torch.Generator().manual_seed(4)
    h = (torch.randn((5, 576), generator=gen) * 3).bfloat16()
    w = (1 + 0.1 * torch.randn(576, generator=gen)).bfloat16()
    normed = trunc_bf16(F.rms_norm(h.float(), (576,), eps=1e-5))
    assert torch.equal(rms_norm(h, w, 1e-5).float(), trunc_bf16(normed * w.float()))
    gu = (torch.randn((3, 2 * 1536), generator=gen) * 4).bfloat16().float()
    g, u = gu.chunk(2, dim=-1)
    assert torch.equal(silu_mul(gu.bfloat16()).float(), trunc_bf16(trunc_bf16(F.silu(g)) * u))
    x = torch.randn((3, 12, 64), generator=gen).bfloat16()
    cos, sin = rope_tables(3, 64, gen, torch.bfloat16)
    xf, c, s = x.float(), cos.float(), sin.float()
    want = trunc_bf16(trunc_bf16(xf * c) + trunc_bf16(xf.roll(32, dims=-1) * s))
    assert torch.equal(rope(x, cos, sin).float(), want)
