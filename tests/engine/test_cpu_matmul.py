"""The weight-streaming matmul (engine/model/cpu/matmul*.cpp) on every instruction set here.

`torch.ops.servelab.matmul(x, w)` multiplies by bf16 weights or by the GGUF file's own Q4_1 /
Q8_0 rows, dequantizing them in registers. It has three builds of one source, AVX-512, AVX2
and portable C++, chosen at run time; every test below runs each one this CPU can run (all
three on any AVX-512 machine, AVX2 and portable on any x86-64 CI machine), forced by name,
so CI covers the narrow paths whatever CPU it draws. A path this CPU lacks is skipped with a
message saying so.

What is held: the dequantized weights equal gguf-py's to the bit; the product equals
dequantize-then-F.linear within fp32 accumulation-order error; every row's result is the
same bits whatever the other rows, their number and the thread count (batch invariance);
and the engine with weights="gguf" in fp32 decodes transformers' greedy tokens exactly.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.model.cpu import library
from engine.model.loader import load_model
from tests.conftest import PROMPTS, q4_1_edge_blocks

FORMATS = ["q4_1", "q8_0", "bf16"]


@pytest.fixture(scope="module")
def ops():
    assert library.load(), "the C++ CPU kernels did not build (see the message above)"
    return torch.ops.servelab


# the paths built for this machine's architecture (x86-64: avx512, avx2, portable; AArch64:
# neon, portable); tests/engine/test_neon_matmul.py runs the NEON path on x86-64 under qemu
@pytest.fixture(params=[name for name in library.ISAS if name in library.isa_builds()])
def isa(request, ops):
    if not ops.isa_supported(request.param):
        pytest.skip(f"this CPU has no {request.param} (the other paths run here)")
    return request.param


@pytest.fixture(scope="module")
def gguf_tensors():
    """Real rows from the bundled file: a Q4_1 layer and the first rows of the Q8_0 embedding,
    with gguf-py's own fp32 dequantization of each."""
    import gguf
    from gguf import GGUFReader

    from engine.model.loader import _bundled_gguf

    tensors = {t.name: t for t in GGUFReader(str(_bundled_gguf("smollm2-135m"))).tensors}
    out = {}
    for fmt, name, rows in (("q4_1", "blk.3.ffn_gate.weight", 1536),
                            ("q8_0", "token_embd.weight", 1024)):
        t = tensors[name]
        raw = np.array(t.data[:rows])  # a writable copy
        assert t.tensor_type.name == fmt.upper()
        ref = gguf.quants.dequantize(raw, t.tensor_type)
        out[fmt] = (torch.from_numpy(raw), torch.from_numpy(ref.astype(np.float32)))
    bf = (torch.randn(1024, 576, generator=torch.Generator().manual_seed(0)) * 0.05
          ).to(torch.bfloat16)
    out["bf16"] = (bf, bf.float())
    return out


@pytest.mark.parametrize("fmt", FORMATS)
def test_dequantize_equals_gguf_py(ops, isa, gguf_tensors, fmt):
    raw, ref = gguf_tensors[fmt]
    assert torch.equal(ops.dequantize(raw, fmt, isa), ref)


def test_quantize_q8_0_equals_gguf_py():
    """Our Q8_0 quantizer (for the EAGLE head on a GGUF target) writes the bytes gguf-py's
    bit-exact port of ggml-quants.c writes: an all-zero block, exact halves, big and tiny
    weights."""
    import gguf

    from engine.model.gguf import quantize_q8_0

    w = torch.randn(48, 576, generator=torch.Generator().manual_seed(0)) * 0.05
    w[3, :32] = 0  # d = 0
    w[5, :32] = torch.arange(32) * (127 / 31) / 100  # many q land on .5 before rounding
    w[7] *= 1e4
    w[9] *= 1e-6
    ref = gguf.quants.quantize(w.numpy(), gguf.GGMLQuantizationType.Q8_0)
    assert np.array_equal(quantize_q8_0(w).numpy(), ref)


def test_dequantize_q4_1_edge_values(ops, isa):
    """Synthetic blocks: scales that are fp16 subnormals, zero, negative and large; every q."""
    raw, ref = q4_1_edge_blocks()
    got = ops.dequantize(torch.from_numpy(raw), "q4_1", isa).numpy()
    assert np.array_equal(got.view(np.uint32), ref.view(np.uint32))


def _error_bound(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """|fp32 sum in any order - exact sum| <= (K + 2) u sum |x_k w_k| (u = 2^-24), plus the
    final rounding: a bound no correct kernel can miss and a wrong one cannot meet."""
    k = x.shape[1]
    return (k + 4) * 2.0 ** -24 * (x.double().abs() @ w.double().abs().T) + 1e-30


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows", [1, 3, 4, 7, 33])
def test_matmul_equals_dequantized_linear(ops, isa, gguf_tensors, fmt, rows):
    raw, ref = gguf_tensors[fmt]
    x = torch.randn(rows, ref.shape[1], generator=torch.Generator().manual_seed(rows))
    y = ops.matmul(x, raw, fmt, isa)
    exact = F.linear(x.double(), ref.double())
    assert y.dtype == torch.float32 and y.shape == (rows, ref.shape[0])
    assert ((y.double() - exact).abs() <= _error_bound(x, ref)).all()
    # "auto" tells the format from the weight; bf16 x: widened, multiplied, rounded once
    assert torch.equal(ops.matmul(x, raw, "auto", isa), y)
    xb = x.to(torch.bfloat16)
    assert torch.equal(ops.matmul(xb, raw, fmt, isa),
                       ops.matmul(xb.float(), raw, fmt, isa).to(torch.bfloat16))


@pytest.mark.parametrize("fmt", FORMATS)
def test_rows_are_batch_invariant(ops, isa, gguf_tensors, fmt):
    """Property test: a row's output is the same bits alone and in any batch, at any place in
    it, whatever the batch size (every size 1 to 10, the register paths of a decode step and a
    verification pass and the panel after them, then random ones to 40) and thread count."""
    raw, ref = gguf_tensors[fmt]
    pool = torch.randn(48, ref.shape[1], generator=torch.Generator().manual_seed(7))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = torch.cat([ops.matmul(pool[i:i + 1], raw, fmt, isa) for i in range(len(pool))])
        rng = random.Random(f"{fmt}-{isa}")
        for trial, size in enumerate([*range(1, 11), *(rng.randint(1, 40) for _ in range(6))]):
            torch.set_num_threads(rng.choice([1, 2, 3]))
            idx = [rng.randrange(len(pool)) for _ in range(size)]
            got = ops.matmul(pool[idx], raw, fmt, isa)
            assert torch.equal(got, alone[idx]), (trial, len(idx), torch.get_num_threads())
    finally:
        torch.set_num_threads(threads)


def test_isa_env_var_forces_the_plans_path_not_the_kernels(ops, monkeypatch, gguf_tensors):
    """SERVELAB_CPU_ISA is an input to the machine facts (engine/plan.py), read once: it
    becomes the plan's isa, which the engine passes with every call. The kernels never read
    it: a call runs the set it names ("" the widest here, whatever the environment says)."""
    from engine.plan import machine_facts, plan_for

    raw, ref = gguf_tensors["q4_1"]
    x = torch.randn(5, ref.shape[1], generator=torch.Generator().manual_seed(1))
    widest = library.supported_isas()[0]
    for name in library.supported_isas():
        monkeypatch.setenv("SERVELAB_CPU_ISA", name)
        assert machine_facts().isa == name == library.matmul_isa(name)
        assert plan_for(EngineConfig(dtype="float32", weights="gguf")).isa == name
        assert ops.cpu_isa() == widest  # the environment is not the kernels' input
        auto = ops.matmul(x, raw)  # "": the widest set, its variants too
        library.isa_calls(reset=True)
        assert torch.equal(ops.matmul(x, raw, "q4_1", widest), auto)
        assert library.isa_calls() == {"matmul": {widest}}
    monkeypatch.delenv("SERVELAB_CPU_ISA")
    assert machine_facts().isa == widest  # the widest this CPU has


def test_unsupported_or_unknown_isa_is_refused(ops, monkeypatch, gguf_tensors):
    raw, ref = gguf_tensors["q4_1"]
    x = torch.randn(1, ref.shape[1])
    # act as a CPU without AVX-512 (the same check as a CPU that truly lacks it)
    monkeypatch.setenv("SERVELAB_CPU_ISA_DISABLE", "avx512")
    assert not ops.isa_supported("avx512")
    assert ops.cpu_isa() == ("avx2" if ops.isa_supported("avx2") else "portable")
    with pytest.raises(RuntimeError, match="asks for 'avx512', but this CPU does not support"):
        ops.matmul(x, raw, "q4_1", "avx512")
    with pytest.raises(RuntimeError, match="'vnni' is no variant of avx2"):
        ops.matmul(x, raw, "q4_1", "avx2+vnni")
    from engine.plan import machine_facts

    monkeypatch.setenv("SERVELAB_CPU_ISA", "avx512")
    with pytest.raises(ValueError, match="SERVELAB_CPU_ISA asks for 'avx512'"):
        machine_facts()
    with pytest.raises(ValueError, match="SERVELAB_CPU_ISA asks for 'avx512'"):
        LLMEngine(EngineConfig(dtype="float32", weights="gguf"))
    monkeypatch.setenv("SERVELAB_CPU_ISA", "sse9")
    with pytest.raises(ValueError, match="known instruction sets: .*avx2.*portable"):
        machine_facts()


def test_bad_weights_are_refused_clearly(ops):
    x = torch.randn(2, 64)
    with pytest.raises(RuntimeError, match="no bf16, Q4_1 or Q8_0 weight for 64 inputs"):
        ops.matmul(x, torch.zeros(4, 41, dtype=torch.uint8))
    with pytest.raises(RuntimeError, match="format must be 'bf16', 'q8_0' or 'q4_1'"):
        ops.matmul(x, torch.zeros(4, 40, dtype=torch.uint8), "q5_0")
    with pytest.raises(RuntimeError, match="x has 64 columns, the 'q4_1' weight 96"):
        ops.matmul(x, torch.zeros(4, 60, dtype=torch.uint8), "q4_1")


def test_gguf_rows_are_the_dense_weights(ops):
    """The fused GGUF rows (attn_q / attn_k un-permuted) dequantize to exactly the weights
    transformers made of the same file (the dense path's fp32 cache)."""
    from engine.model.gguf import read_linear_weights

    loaded = load_model("smollm2-135m", torch.float32)
    g = read_linear_weights(loaded)
    w, p = loaded.weights, "layers.5."
    dense = {
        "qkv": torch.cat([w[p + f"self_attn.{n}_proj.weight"] for n in "qkv"]),
        "o": w[p + "self_attn.o_proj.weight"],
        "gate_up": torch.cat([w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"]]),
        "down": w[p + "mlp.down_proj.weight"],
    }
    for name, ref in dense.items():
        assert torch.equal(ops.dequantize(g["layers"][5][name], "q4_1"), ref), name
    assert torch.equal(ops.dequantize(g["lm_head"], "q8_0"), w["embed_tokens.weight"])


def test_weights_gguf_needs_a_gguf_model(tmp_path):
    from engine.model.loader import hf_folder

    folder = hf_folder("smollm2-135m")  # a Hugging Face folder (the dense cache) has no GGUF
    with pytest.raises(ValueError, match="weights='gguf' needs a model shipped as a GGUF file"):
        LLMEngine(EngineConfig(model=str(folder), dtype="float32", weights="gguf"))
    with pytest.raises(ValueError, match="weights must be one of"):
        EngineConfig(weights="q4")


MAX_TOKENS = 24


@pytest.mark.slow
@pytest.mark.parametrize("cpp_loop", [True, False], ids=["cpp-loop", "python-loop"])
def test_gguf_engine_equals_transformers_fp32(tokenizer, hf_greedy, monkeypatch, cpp_loop):
    """weights="gguf", fp32: the file's own blocks, multiplied in fp32, give transformers' fp32
    greedy tokens (which dequantizes the same file) token for token, with the C++ layer loop
    and with the Python one."""
    ids = [tokenizer.encode(p, add_special_tokens=False) for p in PROMPTS]
    refs = [hf_greedy(i, MAX_TOKENS) for i in ids]
    eng = LLMEngine(EngineConfig(dtype="float32", weights="gguf", max_num_seqs=8))
    assert eng.model.layout == "gguf" and eng.model.cpp_layer_weights is not None
    took_cpp_loop = []
    decide = eng.model.runs_cpp_layer_loop

    def recorded(meta, backend):  # the loop the step took
        took_cpp_loop.append(cpp_loop and decide(meta, backend))
        return took_cpp_loop[-1]

    monkeypatch.setattr(eng.model, "runs_cpp_layer_loop", recorded)
    outs = eng.generate(ids, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
    assert [o.token_ids for o in outs] == refs
    assert any(took_cpp_loop) == cpp_loop


@pytest.mark.slow
def test_dense_bf16_layout_runs_the_cpp_loop_with_the_same_tokens(tokenizer):
    """layout="bf16" (what a CPU without AMX gets): our matmul on the dense bf16 weights. The
    C++ layer loop and the Python loop give the same tokens, and with weights="gguf" in bf16 a
    request decodes the same tokens alone as in a batch (the matmul is batch-invariant)."""
    import dataclasses

    from engine.model.llama import LlamaModel
    from engine.plan import machine_facts

    ids = [tokenizer.encode(p, add_special_tokens=False) for p in PROMPTS[:4]]
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    eng = LLMEngine(EngineConfig(dtype="bfloat16", max_num_seqs=4, max_model_len=128))
    # the engine's plan, with the dense bf16 weights on this machine's matmul
    plan = dataclasses.replace(eng.plan, weights="dense", layout="bf16",
                               isa=machine_facts().isa, layer_loop="cpp")
    model = LlamaModel(eng.model.loaded, plan, 128)
    assert model.cpp_layer_weights is not None
    eng.model = eng.runner.model = model
    cpp = [o.token_ids for o in eng.generate(ids, params)]
    model.cpp_layer_weights = None  # this model is the test's own, not the shared one
    assert [o.token_ids for o in eng.generate(ids, params)] == cpp

    gguf = LLMEngine(EngineConfig(dtype="bfloat16", weights="gguf", max_num_seqs=4,
                                  max_model_len=128))
    together = [o.token_ids for o in gguf.generate(ids, params)]
    alone = [gguf.generate([i], params)[0].token_ids for i in ids]
    assert together == alone


@pytest.mark.parametrize("fmt", FORMATS)
def test_columns_are_independent_with_tails(ops, isa, gguf_tensors, fmt):
    """Output columns computed in a call of 37 or 3 columns (register-tile and thread-split
    tails) are the same bits as in the full call, at 1 and at 9 rows."""
    raw, ref = gguf_tensors[fmt]
    for rows in (1, 9):
        x = torch.randn(rows, ref.shape[1], generator=torch.Generator().manual_seed(rows))
        full = ops.matmul(x, raw, fmt, isa)
        for first, n in ((0, 37), (101, 3), (5, 1)):
            part = ops.matmul(x, raw[first:first + n].contiguous(), fmt, isa)
            assert torch.equal(part, full[:, first:first + n]), (rows, first, n)
