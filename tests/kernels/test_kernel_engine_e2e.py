"""The engine with attention_backend="triton" generates the same greedy tokens as "torch".

A tiny random Llama (benchmarks/gpu/tiny.py, the GPU check's dry-run model: 2 layers, 4 query /
2 KV heads, head dim 16) runs on CPU through the Triton interpreter (tests/kernels/conftest.py
runs this module in a child pytest under TRITON_INTERPRET=1). Prompts longer than one KV block
exercise the extend kernel (prefill, chunked prefill mixed with decodes); the steps after them
run the split-K decode kernel.
"""

from __future__ import annotations

import pytest
import torch

from benchmarks.gpu.tiny import TINY_VOCAB, save_tiny_llama
from engine import EngineConfig, LLMEngine, SamplingParams

MAX_TOKENS = 10
# lengths: shorter than a block, exactly one block, several blocks with a partial last one
PROMPT_LENS = [5, 16, 37, 50]


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    """A random Llama saved as a Hugging Face folder, with a small word-level tokenizer."""
    return str(save_tiny_llama(tmp_path_factory.mktemp("tiny-llama")))


def _prompts():
    g = torch.Generator().manual_seed(1)
    return [torch.randint(3, TINY_VOCAB, (n,), generator=g).tolist() for n in PROMPT_LENS]


@pytest.fixture
def step_kinds(monkeypatch):
    """Record the query lengths of every attention call the Triton backend gets."""
    from engine.model.attention.triton_backend import TritonAttention

    seen: list[list[int]] = []
    forward = TritonAttention.forward

    def spy(self, q, k_cache, v_cache, meta, scale):
        seen.append(list(meta.query_lens))
        return forward(self, q, k_cache, v_cache, meta, scale)

    monkeypatch.setattr(TritonAttention, "forward", spy)
    return seen


def _generate(folder, backend, **overrides):
    cfg = dict(model=folder, attention_backend=backend, device="cpu", dtype="float32",
               max_model_len=96, block_size=16, max_num_seqs=4)
    cfg.update(overrides)
    eng = LLMEngine(EngineConfig(**cfg))
    assert eng.backend.name == backend
    outs = eng.generate(_prompts(), SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0,
                                                   ignore_eos=True))
    assert eng.allocator.num_free_blocks == eng.allocator.num_blocks, "KV blocks leaked"
    return [o.token_ids for o in outs]


def test_triton_backend_matches_torch_greedy(tiny_llama, step_kinds):
    ref = _generate(tiny_llama, "torch")
    got = _generate(tiny_llama, "triton")
    assert all(len(t) == MAX_TOKENS for t in got)
    assert got == ref
    assert any(max(q) > 16 for q in step_kinds), "no prefill longer than a block (extend)"
    assert any(all(n == 1 for n in q) for q in step_kinds), "no decode-only step"


def test_triton_backend_chunked_prefill_mixed_with_decode(tiny_llama, step_kinds):
    """A 24-token step budget: prompts arrive in chunks while earlier requests decode."""
    ref = _generate(tiny_llama, "torch", max_num_batched_tokens=24)
    got = _generate(tiny_llama, "triton", max_num_batched_tokens=24)
    assert got == ref
    assert any(1 in q and max(q) > 1 for q in step_kinds), "no step mixing prefill and decode"


def test_triton_backend_speculative_verification(tiny_llama):
    """n-gram speculation: verification steps run [last, *draft] through the extend kernel."""
    from engine import SpecConfig

    spec = SpecConfig(method="ngram", num_speculative_tokens=3)
    ref = _generate(tiny_llama, "torch")
    got = _generate(tiny_llama, "triton", spec=spec)
    assert got == ref  # greedy speculation is lossless


def test_fused_triton_ops_match_torch_greedy(tiny_llama, monkeypatch):
    """fused_ops=True: the engine's plan picks the fused Triton RMSNorm/RoPE/SwiGLU (allowed on
    CPU tensors only under the interpreter), and every call goes through them; the greedy
    tokens are the PyTorch ops', through prefill, chunked prefill with decodes, and decode."""
    from servelab_kernels import fused_ops

    calls = {"rms_norm": 0, "add_rms_norm": 0, "rope": 0, "silu_mul": 0}
    for name in calls:
        real = getattr(fused_ops, name)

        def spy(*a, _real=real, _name=name):
            calls[_name] += 1
            return _real(*a)

        monkeypatch.setattr(fused_ops, name, spy)
    for budget in (512, 24):
        ref = _generate(tiny_llama, "torch", max_num_batched_tokens=budget)
        got = _generate(tiny_llama, "triton", fused_ops=True, max_num_batched_tokens=budget)
        assert got == ref
    assert all(n > 0 for n in calls.values()), calls
    eng = LLMEngine(EngineConfig(model=tiny_llama, attention_backend="triton", device="cpu",
                                 dtype="float32", max_model_len=96, fused_ops=True))
    assert eng.plan.layer_ops == "triton" and eng.model.ops.name == "triton"
    assert "fused Triton layer ops" in eng.describe()
