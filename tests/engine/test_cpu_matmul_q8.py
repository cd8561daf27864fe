"""The int8-activation matmul (weights="gguf-q8"; matmul.cpp `matmul_q8`, matmul_isa.cpp).

llama.cpp multiplies its quantized weights by activations rounded to int8 per block of 32
(Q8_0 / Q8_1). `matmul_q8` does the same over the GGUF file's own Q4_1 / Q8_0 bytes, regrouped
16 output columns at a time (`pack_q8`). Each test runs every path this CPU can run: AVX-512
with VNNI's vpdpbusd ("avx512+vnni") and without it ("avx512"), AVX2 and portable C++, named
as the plan names them, so CI covers the narrow paths whatever CPU it draws.

What is held: the rounding of x equals a PyTorch reference bit for bit; the packed bytes are
the GGUF bytes in the documented order; the product equals the exact (fp64) product of the
rounded x and gguf-py's weights within fp32 scaling error (the block sums are integers, exact);
each row's result is the same bits whatever the other rows and their number; the engine's
greedy tokens stay close to the fp32 GGUF engine's, and do not depend on the switches
(tests/engine/test_batch_invariance.py runs the whole matrix with "gguf-q8").
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.model.cpu import library
from tests.conftest import PROMPTS, block_inputs, reference_grouped_pack, teacher_forced_logits


@pytest.fixture(scope="module")
def ops():
    assert library.load(), "the C++ CPU kernels did not build (see the message above)"
    return torch.ops.servelab


def reference_q8(x: torch.Tensor):
    """x rounded as llama.cpp rounds activations (fp32 scales): d = amax / 127, q = x * (127 /
    amax) rounded to the nearest, ties to even."""
    xb = x.float().view(x.shape[0], -1, 32)
    amax = xb.abs().amax(-1)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    q = torch.round(xb * inv.unsqueeze(-1)).to(torch.int8)
    d = amax / 127.0
    return q.view_as(x), d, d * q.int().sum(-1).float()


def test_quantize_q8_equals_the_reference(ops):
    x = block_inputs(7, 1536, 0)
    x[1, 5] = 1e-30  # tiny values beside large ones round to 0
    q, d, s = ops.quantize_q8(x)
    rq, rd, rs = reference_q8(x)
    assert torch.equal(q, rq) and torch.equal(d, rd) and torch.equal(s, rs)
    assert q.abs().max() <= 127


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0"])
def test_pack_q8_is_the_gguf_bytes_regrouped(ops, gguf_rows, fmt):
    raw, _ = gguf_rows[fmt]
    assert torch.equal(ops.pack_q8(raw, fmt), reference_grouped_pack(raw, fmt, 4))


def test_pack_q8_refuses_what_it_cannot_pack(ops, gguf_rows):
    raw, _ = gguf_rows["q4_1"]
    with pytest.raises(RuntimeError, match="groups of 16"):
        ops.pack_q8(raw[:24], "q4_1")
    with pytest.raises(RuntimeError, match="format must be"):
        ops.pack_q8(raw, "bf16")
    with pytest.raises(RuntimeError, match="no packed Q4_1 or Q8_0"):
        ops.matmul_q8(torch.randn(1, 576), raw)


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0", "q4_1-edge"])
@pytest.mark.parametrize("rows", [1, 3, 4, 9, 12])
def test_matmul_q8_equals_the_exact_product(ops, integer_path, gguf_rows, fmt, rows):
    raw, w = gguf_rows[fmt]
    k = w.shape[1]
    x = block_inputs(rows, k, rows)
    q, d, _ = ops.quantize_q8(x)
    xr = (q.double().view(rows, -1, 32) * d.double().unsqueeze(-1)).view(rows, k)
    exact = xr @ w.double().T
    packed = ops.pack_q8(raw, fmt.removesuffix("-edge"))
    got = ops.matmul_q8(x, packed, "auto", integer_path).double()
    # each block's integer sum is exact; what rounds is its scaling and the sum over blocks,
    # a few fp32 roundings per block: bounded by (blocks + 4) units of fp32 over |terms|
    bound = (k // 32 + 4) * 2.0**-23 * (xr.abs() @ w.double().abs().T) + 1e-30
    err = (got - exact).abs()
    assert (err <= bound).all(), f"worst error {(err / bound).max():.2f}x the bound"


@pytest.mark.parametrize("q", [15, 0, "alternating"])
def test_q4_1_block_sums_at_their_largest_are_exact(ops, integer_path, q):
    """The AVX-512 (without VNNI) and AVX2 kernels sum a Q4_1 block's byte products in int16
    and widen once (matmul_isa.cpp, q4_1_block_sum): q = 15 against x = +-127 everywhere is
    the largest such sum (16 products of 1905 per int16 lane: 30480). Every q 15 (or 0, or
    15 and 0 alternating by nibble) with d = 1 and m = 0, against rows of x = +1, -1, and
    alternating +1 / -1: each integer sum is then exactly known, and an int16 that wrapped or
    saturated would be off by 65536 or more."""
    import gguf

    k, n = 256, 16
    byte = {15: 0xFF, 0: 0x00, "alternating": 0x0F}[q]
    block = np.zeros(20, dtype=np.uint8)
    block[0:2] = np.array([0x3C00], dtype=np.uint16).view(np.uint8)  # d = 1.0, m = 0
    block[4:] = byte
    raw = np.tile(block, (n, k // 32))
    w = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q4_1).astype(np.float64)
    x = torch.ones(3, k)
    x[1] = -1.0
    x[2, 1::2] = -1.0
    packed = ops.pack_q8(torch.from_numpy(raw), "q4_1")
    got = ops.matmul_q8(x, packed, "auto", integer_path).double()
    qx, d, _ = ops.quantize_q8(x)
    assert qx.abs().max() == 127
    exact = (qx.double().view(3, -1, 32) * d.double().unsqueeze(-1)).view(3, k) @ \
        torch.from_numpy(w).T
    assert torch.allclose(got, exact, rtol=1e-6, atol=1e-6), (got[:, 0], exact[:, 0])


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0"])
def test_matmul_q8_rows_are_batch_invariant(ops, integer_path, gguf_rows, fmt):
    raw, w = gguf_rows[fmt]
    packed = ops.pack_q8(raw, fmt)
    x = block_inputs(24, w.shape[1], 7)
    full = ops.matmul_q8(x, packed, "auto", integer_path)
    rng = random.Random(0)
    for m in [1, 2, 3, 4, 5, 8, 13]:
        rows = rng.sample(range(24), m)
        got = ops.matmul_q8(x[rows], packed, "auto", integer_path)
        assert torch.equal(got, full[rows]), f"{m} rows {rows}: a row changed with its batch"
    with torch.no_grad():
        before = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            assert torch.equal(ops.matmul_q8(x, packed, "auto", integer_path), full)
        finally:
            torch.set_num_threads(before)


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0"])
def test_vnni_and_plain_avx512_give_the_same_bits(ops, gguf_rows, fmt):
    """Both AVX-512 variants sum the same integers into the same lanes and scale them alike:
    the same bits. So matmul_q8 may take VNNI from 3 rows on and the plain one below, and a
    row's result still does not depend on its batch."""
    if not (ops.isa_supported("avx512") and library.has_vnni()):
        pytest.skip("needs AVX-512 with VNNI")
    raw, w = gguf_rows[fmt]
    packed, x = ops.pack_q8(raw, fmt), block_inputs(12, w.shape[1], 3)
    with_vnni = ops.matmul_q8(x, packed, "auto", "avx512+vnni")  # 12 rows: the VNNI kernel
    assert torch.equal(ops.matmul_q8(x, packed, "auto", "avx512"), with_vnni)


@pytest.fixture(scope="module")
def engines():
    return {w: LLMEngine(EngineConfig(weights=w, max_model_len=256)) for w in ("gguf", "gguf-q8")}


def test_engine_gguf_q8_weights_lie_in_one_region_in_step_order(engines):
    """The packed weights are one allocation (packing.step_order_arena), each matrix after the
    one a decode step reads before it, the first 2 MB aligned, and the same bytes as pack_q8
    of the file's rows."""
    model = engines["gguf-q8"].model
    order = [layer[n] for layer in model.layers for n in model.LINEAR_WEIGHTS] + [model.lm_head]
    base = order[0].untyped_storage().data_ptr()
    assert all(t.untyped_storage().data_ptr() == base for t in order)
    assert order[0].data_ptr() % (2 << 20) == 0
    for a, b in zip(order, order[1:]):
        end = a.data_ptr() + a.numel() * a.element_size()
        assert end <= b.data_ptr() < end + 64
    rows = engines["gguf"].model.layers[3]["gate_up"]
    assert torch.equal(model.layers[3]["gate_up"], torch.ops.servelab.pack_q8(rows, "q4_1"))


def test_engine_gguf_q8_stays_close_to_the_fp32_model(engines):
    """Rounding the activations to int8 moves the logits a little: teacher-forced on the fp32
    GGUF engine's own greedy answers, the int8 engine picks the same next token at nearly
    every position, and its logits stay close to the fp32 ones. Measured on these prompts
    (Zen 4): 94-100% of positions agree per prompt (bf16 activations: 90-100%), the logits
    moved by 2.5-6.1% of their norm on average (bf16: 1.7-2.8%), 28% at the worst position."""
    assert engines["gguf-q8"].model.layout == "gguf-q8"
    assert engines["gguf-q8"].dtype == torch.float32
    params = SamplingParams(max_tokens=24, temperature=0.0)
    agree = total = 0
    for prompt in PROMPTS:
        ids = engines["gguf"].tokenize(prompt)
        ids = ids + engines["gguf"].generate([ids], params)[0].token_ids
        logits = {w: teacher_forced_logits(e, ids) for w, e in engines.items()}
        ref, got = logits["gguf"], logits["gguf-q8"]
        agree += int((ref.argmax(-1) == got.argmax(-1)).sum())
        total += ref.shape[0]
        rel = (got - ref).norm(dim=-1) / ref.norm(dim=-1)
        assert rel.mean() < 0.1, f"{prompt!r}: logits moved by {rel.mean():.3f} of their norm"
    assert agree / total >= 0.93, f"same argmax at {agree} of {total} positions"
