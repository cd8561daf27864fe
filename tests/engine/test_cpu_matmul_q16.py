"""The int16-activation matmul (weights="gguf-q16"; matmul.cpp `matmul_q16`, matmul_isa.cpp).

The same GGUF Q4_1 / Q8_0 bytes as the int8 kernel, regrouped 16 output columns and two q bytes
at a time (`pack_q16`), multiplied by activations rounded to int16 per block of 32: every block's
products are summed exactly in integers, and only the scaling is fp32. Each test runs every path
this CPU can run (AVX-512 with VNNI's vpdpwssd and without it, AVX2, portable C++), forced by
name, so CI covers the narrow paths whatever CPU it draws; tests/engine/test_neon_matmul.py runs the
NEON build under qemu against the AVX2 bits.

What is held: the rounding of x equals a PyTorch reference bit for bit; the packed bytes are the
GGUF bytes in the documented order; the product equals the exact (fp64) product of the rounded x
(and, for Q4_1's m term, of x itself) and gguf-py's weights within fp32 scaling error; the
largest block sums are exact; each row's result is the same bits whatever the other rows and
their number; the engine stays far closer to the fp32 GGUF model than bf16 activations do
(tests/engine/test_batch_invariance.py runs the whole switch matrix with "gguf-q16").
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


def reference_q16(x: torch.Tensor):
    """d = amax / 32767, q = x * (32767 / amax) rounded to the nearest (ties to even), s = the
    block's fp32 sum of x, added in order."""
    xb = x.float().view(x.shape[0], -1, 32)
    amax = xb.abs().amax(-1)
    inv = torch.where(amax > 0, 32767.0 / amax, torch.zeros_like(amax))
    q = torch.round(xb * inv.unsqueeze(-1)).to(torch.int16)
    s = torch.zeros_like(amax)
    for j in range(32):
        s = s + xb[..., j]
    return q.view_as(x), amax / 32767.0, s


def q4_1_mins(raw: torch.Tensor) -> torch.Tensor:
    """Each Q4_1 block's m, spread over its 32 weights: [N, K] fp64."""
    blocks = raw.numpy().reshape(raw.shape[0], -1, 20)
    m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float64)
    return torch.from_numpy(np.repeat(m, 32, axis=1))


def test_quantize_q16_equals_the_reference(ops):
    x = block_inputs(7, 1536, 0)
    x[1, 5] = 1e-30  # tiny values beside large ones round to 0
    q, d, s = ops.quantize_q16(x)
    rq, rd, rs = reference_q16(x)
    assert torch.equal(q, rq) and torch.equal(d, rd) and torch.equal(s, rs)
    assert q.abs().max() <= 32767


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0"])
def test_pack_q16_is_the_gguf_bytes_regrouped(ops, gguf_rows, fmt):
    raw, _ = gguf_rows[fmt]
    assert torch.equal(ops.pack_q16(raw, fmt), reference_grouped_pack(raw, fmt, 2))


def test_pack_q16_refuses_what_it_cannot_pack(ops, gguf_rows):
    raw, _ = gguf_rows["q4_1"]
    with pytest.raises(RuntimeError, match="groups of 16"):
        ops.pack_q16(raw[:24], "q4_1")
    with pytest.raises(RuntimeError, match="format must be"):
        ops.pack_q16(raw, "bf16")
    with pytest.raises(RuntimeError, match="matmul_q16: a weight of shape .* no packed Q4_1"):
        ops.matmul_q16(torch.randn(1, 576), raw)


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0", "q4_1-edge"])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 9, 12])
def test_matmul_q16_equals_the_exact_product(ops, integer_path, gguf_rows, fmt, rows):
    """Against fp64: the d * q part with x as rounded to int16, Q4_1's m part with x itself
    (the kernel adds m * sum(x) per block)."""
    raw, w = gguf_rows[fmt]
    k = w.shape[1]
    x = block_inputs(rows, k, rows)
    q, d, _ = ops.quantize_q16(x)
    xr = (q.double().view(rows, -1, 32) * d.double().unsqueeze(-1)).view(rows, k)
    exact = xr @ w.double().T
    terms = xr.abs() @ w.double().abs().T
    if fmt.startswith("q4_1"):
        m = q4_1_mins(raw)
        exact += (x.double() - xr) @ m.T
        terms += (x.double() - xr).abs() @ m.abs().T
    packed = ops.pack_q16(raw, fmt.removesuffix("-edge"))
    got = ops.matmul_q16(x, packed, "auto", integer_path).double()
    # each block's integer sum is exact; what rounds is its scaling, the block's fp32 sum of x
    # and the sum over blocks: a few fp32 roundings per block, over |terms|
    bound = (k // 32 + 36) * 2.0**-23 * (terms + x.double().abs() @ w.double().abs().T) + 1e-30
    err = (got - exact).abs()
    assert (err <= bound).all(), f"worst error {(err / bound).max():.2f}x the bound"
    # and the rounding itself is small: x is within 2^-16 of each block's largest |x| (half a
    # step of d = amax / 32767, and a little for x * (32767 / amax)'s own fp32 rounding)
    assert ((x.double() - xr).abs().view(rows, -1, 32)
            <= d.double().unsqueeze(-1) * 0.51).all()


@pytest.mark.parametrize("fmt", ["q8_0", "q4_1"])
def test_block_sums_at_their_largest_are_exact(ops, integer_path, fmt):
    """The largest integer sums a block makes: Q8_0's q = -128 (or Q4_1's 15) against x rounded
    to +-32767 everywhere, 32 products a block (Q8_0: 134 M in size, past fp32's 2^24 but a
    multiple of 4096, so exactly representable). Each sum is known exactly; an int32 that
    wrapped, or a pair sum that saturated, would be off by far more than the tolerance."""
    import gguf

    k, n = 256, 16
    if fmt == "q8_0":
        block = np.zeros(34, dtype=np.uint8)
        block[0:2] = np.array([0x3C00], dtype=np.uint16).view(np.uint8)  # d = 1.0
        block[2:] = 0x80  # q = -128
        kind = gguf.GGMLQuantizationType.Q8_0
    else:
        block = np.zeros(20, dtype=np.uint8)
        block[0:2] = np.array([0x3C00], dtype=np.uint16).view(np.uint8)  # d = 1.0, m = 0
        block[4:] = 0xFF  # q = 15
        kind = gguf.GGMLQuantizationType.Q4_1
    raw = np.tile(block, (n, k // 32))
    w = torch.from_numpy(gguf.quants.dequantize(raw, kind).astype(np.float64))
    x = torch.ones(3, k)
    x[1] = -1.0
    x[2, 1::2] = -1.0
    q, d, _ = ops.quantize_q16(x)
    assert q.abs().max() == 32767
    exact = (q.double().view(3, -1, 32) * d.double().unsqueeze(-1)).view(3, k) @ w.T
    packed = ops.pack_q16(torch.from_numpy(raw), fmt)
    got = ops.matmul_q16(x, packed, "auto", integer_path).double()
    assert torch.allclose(got, exact, rtol=1e-6, atol=1e-6), (got[:, 0], exact[:, 0])


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0"])
def test_matmul_q16_rows_are_batch_invariant(ops, integer_path, gguf_rows, fmt):
    raw, w = gguf_rows[fmt]
    packed = ops.pack_q16(raw, fmt)
    x = block_inputs(24, w.shape[1], 7)
    full = ops.matmul_q16(x, packed, "auto", integer_path)
    rng = random.Random(0)
    for m in [1, 2, 3, 4, 5, 8, 9, 13]:
        rows = rng.sample(range(24), m)
        got = ops.matmul_q16(x[rows], packed, "auto", integer_path)
        assert torch.equal(got, full[rows]), f"{m} rows {rows}: a row changed with its batch"
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert torch.equal(ops.matmul_q16(x, packed, "auto", integer_path), full)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0"])
def test_vnni_and_plain_avx512_give_the_same_bits(ops, gguf_rows, fmt):
    """vpdpwssd and vpmaddwd + vpaddd sum the same integers: the same bits, as AVX2 too."""
    if not (ops.isa_supported("avx512") and library.has_vnni()):
        pytest.skip("needs AVX-512 with VNNI")
    raw, w = gguf_rows[fmt]
    packed, x = ops.pack_q16(raw, fmt), block_inputs(12, w.shape[1], 3)
    with_vnni = ops.matmul_q16(x, packed, "auto", "avx512+vnni")
    assert torch.equal(ops.matmul_q16(x, packed, "auto", "avx512"), with_vnni)
    assert torch.equal(ops.matmul_q16(x, packed, "auto", "avx2"), with_vnni)


def amx_tiles(ops) -> int:
    """The row count from which matmul_q16 runs on AMX int8 tiles here; skips without them."""
    start = ops.q16_tiles_from_rows()
    if not start:
        pytest.skip("this CPU (or Linux) gives no AMX int8 tiles (the VNNI and AVX2 paths run "
                    "here, and the AMX kernel gives their bits where it runs)")
    return start


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0", "q4_1-edge"])
def test_amx_tiles_give_the_vnni_and_avx2_bits(ops, gguf_rows, fmt):
    """Steps with many rows run on AMX int8 tiles (x's int16 split into high and low bytes, two
    tile products a block): the same integer sums, scaled alike, so the same bits as vpdpwssd,
    as AVX-512 without VNNI and as AVX2, at row counts that fill tiles and that leave a partial
    last tile, on 1 thread and on all."""
    start = amx_tiles(ops)
    raw, w = gguf_rows[fmt]
    packed = ops.pack_q16(raw, fmt.removesuffix("-edge"))
    for rows in (start, start + 1, 2 * start - 3, 3 * start + 5):
        x = block_inputs(rows, w.shape[1], rows)  # every block's largest |x| at +-32767
        tiles = ops.matmul_q16(x, packed, "auto", "avx512+vnni+amx")
        before = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            assert torch.equal(ops.matmul_q16(x, packed, "auto", "avx512+amx"), tiles)
        finally:
            torch.set_num_threads(before)
        for isa in ("avx512+vnni", "avx512", "avx2"):
            assert torch.equal(ops.matmul_q16(x, packed, "auto", isa), tiles), \
                f"{rows} rows: {isa} differs from AMX tiles"


@pytest.mark.parametrize("fmt", ["q8_0", "q4_1"])
def test_amx_tiles_sum_the_largest_blocks_exactly(ops, fmt):
    """x at +-32767 (high byte -128 or 127, low byte 1 or 255) against Q8_0's q = -128 and
    Q4_1's 15: the sums are known exactly, and the tiles give them (an int32 that wrapped, or a
    sign lost in the split, would be far off)."""
    import gguf

    start = amx_tiles(ops)
    k, n = 256, 16
    if fmt == "q8_0":
        block = np.zeros(34, dtype=np.uint8)
        block[0:2] = np.array([0x3C00], dtype=np.uint16).view(np.uint8)
        block[2:] = 0x80
        kind = gguf.GGMLQuantizationType.Q8_0
    else:
        block = np.zeros(20, dtype=np.uint8)
        block[0:2] = np.array([0x3C00], dtype=np.uint16).view(np.uint8)
        block[4:] = 0xFF
        kind = gguf.GGMLQuantizationType.Q4_1
    raw = np.tile(block, (n, k // 32))
    w = torch.from_numpy(gguf.quants.dequantize(raw, kind).astype(np.float64))
    x = torch.ones(start, k)
    x[1::3] = -1.0
    x[2::3, 1::2] = -1.0
    q, d, _ = ops.quantize_q16(x)
    exact = (q.double().view(start, -1, 32) * d.double().unsqueeze(-1)).view(start, k) @ w.T
    got = ops.matmul_q16(x, ops.pack_q16(torch.from_numpy(raw), fmt), "auto", "avx512+amx")
    assert torch.allclose(got.double(), exact, rtol=1e-6, atol=1e-6), (got[:3, 0], exact[:3, 0])


def test_engine_tokens_and_logits_are_the_same_with_amx_tiles_and_without(ops, monkeypatch):
    """The whole engine on gguf-q16 with 16 requests decoding together (every step's matmuls on
    AMX tiles) and with the tiles turned off (VNNI): the same greedy tokens and the same logits
    bit for bit, prefill (one long prompt's rows) included. The tiles are off through the
    plan: SERVELAB_CPU_ISA_DISABLE=amx is a fact of the machine, so the plan's isa lacks "+amx",
    and the kernels run what the plan passes them."""
    amx_tiles(ops)
    prompts = [f"{PROMPTS[i % len(PROMPTS)]} ({i})" for i in range(16)]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    out, logits = {}, {}
    for disabled in ("", "amx"):
        monkeypatch.setenv("SERVELAB_CPU_ISA_DISABLE", disabled)
        eng = LLMEngine(EngineConfig(weights="gguf-q16", max_num_seqs=16, max_model_len=256))
        assert eng.plan.isa.endswith("+amx") == (not disabled)
        ids = eng.tokenize(PROMPTS[0]) * 3  # a prompt of more rows than a tile
        library.isa_calls(reset=True)
        out[disabled] = [r.token_ids for r in eng.generate(prompts, params)]
        logits[disabled] = teacher_forced_logits(eng, ids)
        assert set().union(*library.isa_calls().values()) == {eng.plan.isa}
    assert out[""] == out["amx"]
    assert torch.equal(logits[""], logits["amx"])


@pytest.fixture(scope="module")
def engines():
    return {name: LLMEngine(EngineConfig(weights=w, dtype=dtype, max_model_len=256))
            for name, w, dtype in (("fp32", "gguf", "float32"), ("bf16", "gguf", "bfloat16"),
                                   ("q16", "gguf-q16", "float32"))}


@pytest.mark.slow
def test_engine_gguf_q16_is_far_closer_to_the_fp32_model_than_bf16(engines):
    """Teacher-forced on the fp32 GGUF engine's own greedy answers: int16 activations move the
    logits by under 0.2% of their norm on average (measured on these prompts on a Zen 4:
    0.04-0.08% with the default float16 KV cache, 0.03-0.05% with a float32 one, as
    `python -m benchmarks.kernel_bench --kv-quality` prints; bf16:
    1.7-2.8%; int8: 2.5-6%), at least 10 times less than bf16 activations on
    every prompt, and pick the fp32 engine's next token at 99% of positions or more."""
    assert engines["q16"].model.layout == "gguf-q16"
    params = SamplingParams(max_tokens=24, temperature=0.0)
    agree = total = 0
    for prompt in PROMPTS:
        ids = engines["fp32"].tokenize(prompt)
        ids = ids + engines["fp32"].generate([ids], params)[0].token_ids
        logits = {name: teacher_forced_logits(e, ids) for name, e in engines.items()}
        ref = logits["fp32"]
        rel = {name: ((logits[name] - ref).norm(dim=-1) / ref.norm(dim=-1)).mean().item()
               for name in ("bf16", "q16")}
        assert rel["q16"] < 2e-3, f"{prompt!r}: logits moved by {rel['q16']:.2e} of their norm"
        assert rel["q16"] * 10 < rel["bf16"], (prompt, rel)
        agree += int((ref.argmax(-1) == logits["q16"].argmax(-1)).sum())
        total += ref.shape[0]
    assert agree / total >= 0.99, f"same argmax at {agree} of {total} positions"
