"""The C++ CPU kernels (engine/model/cpu/ops.cpp) compute exactly what the PyTorch code does.

Each kernel replaces 3 to 8 PyTorch operators. They must give the same bits, not merely
close numbers: a greedy engine is compared token for token with transformers, and one
flipped rounding can change a token. So every kernel is checked with `torch.equal` against
its PyTorch twin in llama.py, in each model dtype, at decode and prefill sizes, on the
strided views the forward pass really hands them; then whole engines are compared.

The machine that runs these tests has g++ (CI installs nothing else for it), so the kernels
must build: a failed build fails here instead of silently testing the fallback.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.model.attention import TorchAttention, build_metadata
from engine.model.cpu import library as cpu_library
from engine.model.cpu.attention import CpuAttention
from engine.model.cpu.packing import amx_linear, vnni_pack
from engine.model.llama import LlamaModel, add_rms_norm, apply_rope, rms_norm, silu_mul
from tests.conftest import PROMPTS

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
ROWS = [1, 5, 16, 40]  # decode batches and a prefill chunk (40 x 1536 takes ATen's path)


@pytest.fixture(scope="module")
def ops():
    assert cpu_library.load(), "the C++ CPU kernels did not build (see the message above)"
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
@pytest.mark.parametrize("hidden", [576, 896, 4096 + 48])  # 4096 + 48: ATen's cascade
def test_add_rms_norm_is_bit_identical(ops, dtype, rows, hidden):
    h = _rand(rows, hidden, dtype=dtype, scale=2.0)
    h[:, 3] *= 60
    delta = _rand(rows, hidden, dtype=dtype, scale=0.5, seed=1)
    w = _rand(hidden, dtype=dtype, seed=2)
    got, want = ops.add_rms_norm(h, delta, w, 1e-6), add_rms_norm(h, delta, w, 1e-6)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


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
    meta = build_metadata([n], [n], [[0]], slots.tolist(), 8)
    TorchAttention().store_kv(caches[0], caches[1], k, v, meta)
    CpuAttention().store_kv(caches[2], caches[3], k, v, meta)
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


needs_amx = pytest.mark.skipif(not cpu_library.amx_available(),
                               reason="this CPU (or kernel) has no AMX bf16 tiles")


@needs_amx
@pytest.mark.parametrize("rows", [1, 5, 16, 17, 40, 130])  # decodes, and row tiles past one
@pytest.mark.parametrize("out_in", [(960, 576), (576, 1536), (4096, 576)])
def test_amx_linear_rounds_the_exact_product(rows, out_in):
    """The AMX matmul adds bf16 products in fp32 and rounds once: each output is the exact
    (fp64) result rounded to bf16, give or take one bf16 step where fp32 addition order moves
    a value across a rounding boundary (or, where large terms cancel, fp32's own error on
    the terms' magnitude)."""
    n, k = out_in
    x = _rand(rows, k, dtype=torch.bfloat16, scale=2.0)
    w = _rand(n, k, dtype=torch.bfloat16, scale=0.05, seed=1)
    b = _rand(n, dtype=torch.bfloat16, seed=2)
    exact = x.double() @ w.double().T
    magnitude = x.double().abs() @ w.double().abs().T
    for bias, ref in ((None, exact), (b, exact + b.double())):
        y = amx_linear(x, vnni_pack(w), bias)
        assert y.dtype == torch.bfloat16 and y.shape == (rows, n)
        rounded = ref.to(torch.bfloat16)
        ulp = rounded.double().abs() * 2.0 ** -7
        assert ((y.double() - ref).abs() <= ulp + magnitude * 2.0 ** -20).all()
        assert (y == rounded).double().mean() > 0.99
        assert (y == torch.nn.functional.linear(x, w, bias)).double().mean() > 0.99


@needs_amx
def test_amx_linear_names_bad_inputs(ops):
    w = vnni_pack(torch.randn(32, 64, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="x has 96 columns, the weight 64"):
        ops.amx_linear(torch.randn(2, 96, dtype=torch.bfloat16), w)
    with pytest.raises(RuntimeError, match="vnni_pack"):
        ops.amx_linear(torch.randn(2, 64, dtype=torch.bfloat16), torch.randn(32, 64))
    with pytest.raises(RuntimeError, match="2-D bf16"):
        ops.amx_linear(torch.randn(2, 64), w)
    with pytest.raises(RuntimeError, match="bias has 5 values for 32 outputs"):
        ops.amx_linear(torch.randn(2, 64, dtype=torch.bfloat16), w, torch.randn(5))


@needs_amx
def test_engine_packs_for_amx_only_with_the_kernels():
    assert LLMEngine(EngineConfig(dtype="bfloat16", max_num_seqs=1)).model.layout == "amx"
    plain = LLMEngine(EngineConfig(dtype="bfloat16", max_num_seqs=1, cpu_kernels=False))
    assert plain.model.layout == "plain" and plain.model.row.refusal(
        "cpu", "bfloat16", False, []) is None
    from engine.model.layouts import LAYOUTS

    assert LAYOUTS["amx"].refusal("cpu", "bfloat16", False, []).startswith(
        "needs the C++ CPU kernels")


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_engines_with_and_without_the_kernels_give_the_same_tokens(dtype):
    """Whole engines, batched prefill and decode: identical greedy tokens. Both use the
    torch attention backend: the C++ attention kernel rounds differently from SDPA in bf16
    (tests/engine/test_attention.py checks it); every other small kernel must change nothing. In
    bf16 the kernels also bring the AMX matmul or our own bf16 matmul (layout "bf16"), which
    add in other orders than F.linear (test_amx_linear_rounds_the_exact_product;
    test_packing.py compares the models' logits): here both sides use plain F.linear."""
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    runs = {}
    for kernels in (True, False):
        eng = LLMEngine(EngineConfig(dtype=dtype, cpu_kernels=kernels, max_num_seqs=8,
                                     attention_backend="torch", weights="dense"))
        assert eng.uses_cpu_kernels is kernels
        assert eng.model.ops.name == ("cpu" if kernels else "torch")
        if eng.model.layout in ("amx", "bf16"):
            plain = dataclasses.replace(eng.plan, layout="plain", isa=None, layer_loop="python")
            eng.model = eng.runner.model = LlamaModel(eng.model.loaded, plain, 1024)
        runs[kernels] = [o.token_ids for o in eng.generate(PROMPTS, params)]
    assert runs[True] == runs[False]


def test_off_switch_falls_back_to_pytorch(monkeypatch):
    monkeypatch.setenv("SERVELAB_CPU_OPS", "0")
    cpu_library.load.cache_clear()
    try:
        assert not cpu_library.available(torch.device("cpu"), torch.float32)
    finally:
        monkeypatch.delenv("SERVELAB_CPU_OPS")
        cpu_library.load.cache_clear()
    assert cpu_library.available(torch.device("cpu"), torch.float32)


# (dtype, weights): the layouts the C++ layer loop runs. AMX's bf16 tiles (the default on an
# AMX CPU) only there; the others on any x86-64 or AArch64 CPU
LOOP_LAYOUTS = [
    pytest.param("bfloat16", "auto", marks=needs_amx, id="amx"),
    pytest.param("float32", "gguf", id="gguf-fp32"),
    pytest.param("bfloat16", "gguf", id="gguf-bf16"),
    pytest.param("float32", "gguf-q8", id="gguf-q8"),  # a float16 KV cache (the plan's kv_dtype)
    pytest.param("float32", "gguf-q16", id="gguf-q16"),
]


@pytest.mark.parametrize("dtype,weights", LOOP_LAYOUTS)
@pytest.mark.parametrize("query_lens", [
    [1, 1, 1],  # decodes
    [3, 3, 3],  # verifications of 2-token drafts
    [1, 5, 70],  # a decode, a prompt's chunk and a whole longer prompt in one step
])
def test_cpp_layer_loop_is_the_python_loop(tokenizer, query_lens, dtype, weights):
    """A step whose attention the C++ kernel takes whole (any step, with the kernel's head
    shapes) runs the layer stack in one C++ call (decode_layers); it must
    give exactly the bits of the Python loop over the same kernels, and write the same K/V,
    for every weight layout the loop runs."""
    eng = LLMEngine(EngineConfig(dtype=dtype, weights=weights, max_num_seqs=4))
    model, bs = eng.model, eng.config.block_size
    assert model.cpp_layer_weights is not None and eng.backend_name == "cpu"
    assert model.layout == ("amx" if weights == "auto" else weights)
    # the same plan (weights, kernels, instruction set), with the layer loop in Python
    python_loop = LlamaModel(model.loaded, dataclasses.replace(eng.plan, layer_loop="python"),
                             1024)
    assert (python_loop.row, python_loop.isa) == (model.row, model.isa) == (eng.plan.row,
                                                                            eng.plan.isa)
    # three requests with cached contexts of different lengths, each in its own blocks
    contexts = [tokenizer.encode(p, add_special_tokens=False) for p in PROMPTS[:3]]
    tables, next_block = [], 0
    for ids, m in zip(contexts, query_lens):
        n = len(ids) + m
        tables.append(list(range(next_block, next_block + -(-n // bs))))
        next_block += len(tables[-1])
        meta = build_metadata([len(ids)], [len(ids)], [tables[-1]],
                              [tables[-1][p // bs] * bs + p % bs for p in range(len(ids))],
                              bs, eng.device)
        model.forward(torch.tensor(ids), torch.arange(len(ids)), meta, eng.pool.layers,
                      eng.backend)
    new_ids, positions, slots = [], [], []
    for ids, table, m in zip(contexts, tables, query_lens):
        for p in range(len(ids), len(ids) + m):
            new_ids.append(ids[p % len(ids)])
            positions.append(p)
            slots.append(table[p // bs] * bs + p % bs)
    meta_args = (query_lens, [len(ids) + m for ids, m in zip(contexts, query_lens)], tables,
                 slots, bs, eng.device)
    assert model.runs_cpp_layer_loop(build_metadata(*meta_args), eng.backend)
    assert not python_loop.runs_cpp_layer_loop(build_metadata(*meta_args), eng.backend)
    outs, pools = [], []
    for m in (model, python_loop):
        outs.append(m.forward(torch.tensor(new_ids), torch.tensor(positions),
                              build_metadata(*meta_args), eng.pool.layers, eng.backend))
        pools.append([t.clone() for kv in eng.pool.layers for t in kv])
    assert torch.equal(outs[0], outs[1])
    assert all(torch.equal(a, b) for a, b in zip(*pools))
    assert not model.runs_cpp_layer_loop(build_metadata(*meta_args), TorchAttention())
