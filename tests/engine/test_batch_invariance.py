"""Batch invariance: flipping a switch never changes the text, in bf16.

A request's greedy tokens must not depend on what else the engine computes next to it: the
other requests of a batch, static or continuous batching, contiguous or paged KV, a prompt
cut into chunks, a preemption and its recompute, a draft verified by prompt lookup or by the
draft model. Greedy decoding picks the largest logit, so a single flipped last bit anywhere
in a row can change a token, and from there the rest of the text. The chapter calls
batching and paging pure scheduling and speculation lossless; these tests hold the engine to
that, bit for bit.

The guarantee rests on every kernel computing a row (a token) on its own, in an order that
depends on nothing else in the call:
  * the attention kernel (engine/model/cpu/ops.cpp, paged_attention): every query count, one
    arithmetic; a query row's bits do not depend on the other queries, the other requests or
    the thread count (property test below);
  * the per-row ops (RMSNorm, residual + RMSNorm, rotary, SwiGLU), C++ and PyTorch twins;
  * the sampler (each row's token from its own row);
  * the matmul (the weight layout's kernel): its property test lives with the matmul.
Then whole engines, over the matrix of switches, against each request decoded alone.

MATMUL_LAYOUTS lists the weight layouts run through the engine matrix: "amx" (the AMX kernel,
linear.cpp; skipped on CPUs without AMX), "bf16" (the weight-streaming matmul, matmul_isa.cpp,
the layout on CPUs without AMX) and "gguf" (the same matmul on the GGUF file's own blocks,
weights="gguf"), in bf16; "gguf-fp32" is the engine's default on CPUs
without AMX (dtype="auto" -> float32 on GGUF weights); "gguf-q8" and "gguf-q16" are the same
blocks with int8 (llama.cpp's arithmetic) and int16 activations, in float32. Plain F.linear
("plain", the reference and the GPU's layout) is not held to this: its BLAS may add in an
order that depends on the number of rows.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.workloads import get_workload
from engine import EngineConfig, LLMEngine, SamplingParams, SpecConfig, plan
from engine.model import llama
from engine.model.attention import build_metadata
from engine.model.cpu import library as cpu_library
from engine.model.cpu.attention import CpuAttention
from engine.sampler import sample_rows
from tests.conftest import PROMPTS

MATMUL_LAYOUTS = ["amx", "bf16", "gguf", "gguf-fp32", "gguf-q8", "gguf-q16"]
if os.environ.get("SERVELAB_INVARIANCE_LAYOUTS"):
    MATMUL_LAYOUTS = os.environ["SERVELAB_INVARIANCE_LAYOUTS"].split(",")


@contextlib.contextmanager
def threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="module")
def ops():
    assert cpu_library.load(), "the C++ CPU kernels did not build (see the message above)"
    return torch.ops.servelab


# ---------------------------------------------------------------------------------------------
# Fast: the attention kernel, any batch composition

# one request of a batch: (query tokens, cached context before them)
request = st.tuples(st.integers(1, 90), st.integers(0, 300))


@settings(max_examples=100, deadline=None)
@given(target=request, others=st.lists(request, max_size=5), where=st.integers(0, 5),
       num_threads=st.sampled_from([1, 2, 3]), block_size=st.sampled_from([1, 5, 16]),
       shape=st.sampled_from([(64, 3, 3), (128, 1, 2), (64, 8, 1)]),
       dtype=st.sampled_from([torch.bfloat16, torch.float16, torch.float32]),
       chunk=st.sampled_from([256, 256, 0, 1, 13, 64]), seed=st.integers(0, 2**16))
def test_attention_rows_do_not_depend_on_the_batch(ops, target, others, where, num_threads,
                                                   block_size, shape, dtype, chunk, seed):
    """A request's m query rows, computed in one call with other requests of other query
    counts (before and after it) on num_threads threads, are bit for bit the rows each query
    gets alone as a 1-token decode, on one thread. m runs past 64: long prompts, chunks and
    recomputes take the kernel too. `chunk`: the kernel splits contexts longer than this into
    parts, one task each (256: the default, CpuAttention's; 0: no split); the split depends on
    a query's own context only, so it never makes a row depend on the batch."""
    d, group, kvh = shape
    heads = group * kvh
    g = torch.Generator().manual_seed(seed)
    where = min(where, len(others))
    reqs = others[:where] + [target] + others[where:]
    seq_lens = [m + ctx for m, ctx in reqs]
    num_blocks = sum(-(-n // block_size) for n in seq_lens) + 3
    kc = torch.randn(num_blocks, block_size, kvh, d, generator=g).to(dtype)
    vc = torch.randn(num_blocks, block_size, kvh, d, generator=g).to(dtype)
    perm = torch.randperm(num_blocks, generator=g).tolist()
    tables, used = [], 0
    for n in seq_lens:
        tables.append(perm[used:used + -(-n // block_size)])
        used += len(tables[-1])
    q = torch.randn(sum(m for m, _ in reqs), heads, d, generator=g).to(dtype)
    query_lens = [m for m, _ in reqs]
    backend = CpuAttention()

    def attention(q, meta):
        if chunk == 256:
            return backend.forward(q, kc, vc, meta, d ** -0.5)
        return ops.paged_attention(q, kc, vc, meta.block_tables, meta.seq_lens,
                                   meta.query_start_loc, d ** -0.5, chunk)

    meta = build_metadata(query_lens, seq_lens, tables, [-1] * len(q), block_size)
    with threads(num_threads):
        batched = attention(q, meta)
    m, ctx = target
    first = sum(query_lens[:where])
    table = tables[where]
    with threads(1):
        for i in range(m):
            alone = build_metadata([1], [ctx + i + 1], [table], [-1], block_size)
            row = q[first + i:first + i + 1].clone()
            want = attention(row, alone)
            assert torch.equal(batched[first + i], want[0]), (
                f"query {i} of {m} (context {ctx}) differs batched with {others}")


# ---------------------------------------------------------------------------------------------
# Fast: the per-row ops and the sampler

ROW_COUNTS = [1, 2, 7, 16, 22, 40, 57, 130, 300]  # 22+, 57+: where ATen's paths change


def _row_ops(dtype: torch.dtype, kernels: bool):
    """(name, fn(rows) -> tensors, each [n, ...] with one row per token) for each per-row op,
    the C++ kernels' or their PyTorch twins. A batch is built from per-row random numbers, so
    row r's inputs are the same whatever else is in the batch."""
    hidden, inter, hq, hkv, d = 576, 1536, 9, 3, 64
    eps = 1e-5

    def inputs(rows, width, salt):
        return torch.stack([torch.randn(width, generator=torch.Generator().manual_seed(
            r * 7919 + salt)) * 2 for r in rows]).to(dtype)

    w = inputs([0], hidden, 1)[0]
    layer = llama.cpu_kernel_ops() if kernels else llama.TORCH_OPS
    return [
        ("rms_norm", lambda r: [layer.rms_norm(inputs(r, hidden, 2), w, eps)]),
        ("add_rms_norm", lambda r: list(layer.add_rms_norm(
            inputs(r, hidden, 3), inputs(r, hidden, 4) * 0.3, w, eps))),
        # q and k heads of the fused qkv output: a strided view, as the forward passes it
        ("rope", lambda r: [layer.rope(
            inputs(r, (hq + 2 * hkv) * d, 5)[:, :(hq + hkv) * d].view(len(r), hq + hkv, d),
            inputs(r, d, 6).unsqueeze(1), inputs(r, d, 7).unsqueeze(1))]),
        ("silu_mul", lambda r: [layer.silu_mul(inputs(r, 2 * inter, 8))]),
    ]


@pytest.mark.parametrize("kernels", [True, False], ids=["cpp", "torch"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_per_row_ops_do_not_depend_on_the_batch(ops, dtype, kernels):
    """Each op on rows [r0, r1, ...] (1 to 300 rows, 1 to 3 threads) gives row r exactly what
    it gives r alone on one thread."""
    rng = random.Random(0)
    for name, fn in _row_ops(dtype, kernels):
        for n in ROW_COUNTS:
            rows = rng.sample(range(1000), n)
            with threads(rng.choice([1, 2, 3])):
                batched = fn(rows)
            with threads(1):
                for i in sorted(rng.sample(range(n), min(n, 3))):
                    alone = fn([rows[i]])
                    for b, a in zip(batched, alone):
                        assert torch.equal(b[i], a[0]), f"{name}: row {i} of {n} differs"


def test_sampler_rows_do_not_depend_on_the_batch():
    """Greedy rows take their own argmax, sampling rows draw with their own generator, so a
    row's token is the one it gets alone, whatever rows share the call."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(9, 49152, generator=g) * 4
    params = [SamplingParams(temperature=t, top_p=p, top_k=k) for t, p, k in
              [(0, 1, 0), (0.8, 0.9, 0), (1.0, 1, 20), (0, 1, 0), (0.5, 0.5, 5), (0, 1, 0),
               (1.2, 0.95, 0), (0, 1, 0), (0.7, 1, 0)]]

    def gens():
        return [torch.Generator().manual_seed(100 + i) for i in range(len(params))]

    together = sample_rows(logits, params, gens())
    alone = [sample_rows(logits[i:i + 1], [p], [gen])[0]
             for i, (p, gen) in enumerate(zip(params, gens()))]
    assert together == alone


# ---------------------------------------------------------------------------------------------
# Slow: whole engines, every switch, against each request alone

# tokens per request: past where a flipped last bit has shown as a changed token on a CPU
# without AMX, and past the preemption case's second preemption (CASES)
MAX_TOKENS = 32


@functools.lru_cache(maxsize=1)
def _prompts() -> tuple[str, ...]:
    """Short and long answers of chat traffic (35, 40 tokens), a grounded prompt (80 tokens:
    one prefill step alone, chunks under a small budget), a long system prompt (307 tokens),
    and two plain prompts."""
    longtail = get_workload("longtail", 12).prompts
    return (longtail[6], longtail[11], get_workload("grounded", 1).prompts[0],
            get_workload("shared-prefix", 1).prompts[0], PROMPTS[1], PROMPTS[3])


CASES = {
    "continuous-paged": dict(max_num_seqs=8),
    "static-contiguous": dict(max_num_seqs=8, batching="static", kv_layout="contiguous"),
    # prompts cut into chunks of a 24-token budget, beside others' decodes
    "chunked-prefill": dict(max_num_seqs=8, max_num_batched_tokens=24),
    # 26 blocks of 16 hold about half of what the six need, the 307-token prompt boards
    # first (FIRST below): two requests are preempted after 9 and 30 tokens, and one of them
    # is recomputed as a 65-token prefill
    "preemption": dict(max_num_seqs=6, block_size=16, num_kv_blocks=26, max_model_len=400),
    "ngram": dict(max_num_seqs=8, spec=SpecConfig("ngram", 4)),
    "draft": dict(max_num_seqs=8, spec=SpecConfig("draft", 4)),
}
FIRST = {"preemption": 3}  # the prompt submitted first (the others follow in order)


@contextlib.contextmanager
def forced_layout(layout: str):
    """Engines built inside get `layout` for their weights (and its matmul), whatever this
    CPU's default is."""
    original = plan.dense_layout
    plan.dense_layout = lambda *args, **kwargs: layout
    try:
        yield
    finally:
        plan.dense_layout = original


def _engine(layout: str, **kw) -> LLMEngine:
    if layout == "amx" and not cpu_library.amx_available():
        pytest.skip("this CPU has no AMX tiles; the other layouts cover the matrix here")
    if layout in ("gguf", "gguf-fp32", "gguf-q8", "gguf-q16"):
        dtype = "bfloat16" if layout == "gguf" else "float32"
        weights = "gguf" if layout == "gguf-fp32" else layout
        eng = LLMEngine(EngineConfig(dtype=dtype, weights=weights,
                                     **{"max_model_len": 512, **kw}))
        assert eng.model.layout == weights and eng.model.dtype == getattr(torch, dtype)
        return eng
    with forced_layout(layout):
        eng = LLMEngine(EngineConfig(dtype="bfloat16", weights="dense",
                                     **{"max_model_len": 512, **kw}))
    assert eng.model.layout == layout and eng.model.dtype == torch.bfloat16
    return eng


def _params() -> SamplingParams:
    return SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)


@functools.cache
def _alone(layout: str) -> tuple[tuple[int, ...], ...]:
    """Each prompt decoded by itself: one seat, every step its own."""
    eng = _engine(layout, max_num_seqs=1)
    return tuple(tuple(eng.generate([p], _params())[0].token_ids) for p in _prompts())


def _first_differences(got, want) -> list[tuple[int, int]]:
    """(request, first differing token) for every request whose tokens differ."""
    return [(i, next(j for j, (x, y) in enumerate(zip(a, b)) if x != y))
            for i, (a, b) in enumerate(zip(got, want)) if a != b]


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
# one xdist group per layout (tests/conftest.py keeps a group on one worker): the layout's
# reference (_alone) is computed once, and the layouts spread over the workers
@pytest.mark.parametrize("layout", [
    pytest.param(layout, marks=pytest.mark.xdist_group(f"batch-invariance-{layout}"))
    for layout in MATMUL_LAYOUTS])
def test_greedy_tokens_do_not_depend_on_the_switches(layout, case):
    alone = _alone(layout)
    eng = _engine(layout, **CASES[case])
    order = list(range(len(_prompts())))
    if case in FIRST:
        order.insert(0, order.pop(FIRST[case]))
    rids = {i: eng.add_request(_prompts()[i], _params()) for i in order}
    preempted = 0
    while eng.has_unfinished():
        preempted += len(eng.step().preempted)
    got = [tuple(eng.output(rids[i]).token_ids) for i in range(len(order))]
    differ = _first_differences(got, alone)
    assert not differ, (f"{layout}, {case}: {len(differ)} of {len(got)} requests differ from "
                        f"alone (request, first differing token): {differ}")
    if case == "preemption":
        assert preempted >= 2, f"the pool was meant to force two preemptions, got {preempted}"
    if eng.spec_decoder is not None:
        assert eng.metrics_snapshot()["acceptance_rate"], "no draft was ever accepted"
    assert eng.allocator.num_free_blocks == eng.allocator.num_blocks
