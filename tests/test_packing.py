"""Packed bf16 weights compute the same model as plain ones.

`LlamaModel(layout=...)` (engine/model/cpu/packing.py) reorders the linear weights once so the
matmul kernels read them directly: for our AMX matmul where the CPU has AMX and the C++
kernels load (then the C++ layer loop runs decode steps too), else into oneDNN's blocked
layout (measured gain in docs/performance.md). The matmuls then accumulate in a different order, so the
bf16 logits may differ in the last bits, never in substance: the next-token choice agrees,
the logits agree to bf16 precision, and the built-in draft, which quantizes the plain
weights, is the same whether the target is packed or not.
"""

from __future__ import annotations

import pytest
import torch

from engine import EngineConfig, LLMEngine, SamplingParams, SpecConfig
from engine.model import cache
from engine.model.cpu.packing import cpu_packing_available
from engine.model.llama import LlamaModel
from engine.spec.draft import BUILTIN_RECIPE, QuantizedLlama
from tests.conftest import PROMPTS, teacher_forced_logits

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not cpu_packing_available(torch.device("cpu"), torch.bfloat16),
                       reason="this CPU's oneDNN has no bf16 packed linear"),
]


def _packed_config(**kw) -> EngineConfig:
    """A bf16 engine whose weights are packed: AMX tiles where the CPU has them, else oneDNN's
    blocked layout (with the C++ kernels, a CPU without AMX runs the plain "bf16" layout)."""
    from engine.model.cpu import library

    return EngineConfig(dtype="bfloat16", weights="dense",
                        cpu_kernels=bool(library.load() and library.amx_available()), **kw)


def test_packed_logits_match_plain(tokenizer):
    plain = LLMEngine(EngineConfig(dtype="bfloat16", max_num_seqs=1, pack_weights=False,
                                   weights="dense"))
    packed = LLMEngine(_packed_config(max_num_seqs=1))
    assert packed.model.packed and not plain.model.packed
    assert packed.model.weight_bytes == plain.model.weight_bytes
    agree = total = 0
    for prompt in PROMPTS:
        ids = tokenizer.encode(prompt, add_special_tokens=False)
        a, b = teacher_forced_logits(plain, ids), teacher_forced_logits(packed, ids)
        assert torch.isfinite(b).all()
        scale = a.abs().amax(-1, keepdim=True)
        rel = (a - b).abs() / scale
        # bf16 roundings in another order over 30 layers: on an Intel CPU without AMX
        # (oneDNN's AVX-512 bf16 kernels) the worst of 27 x 49152 logits was 0.067 of the
        # position's largest, the mean 0.007; wrong weights or layout give tenths
        assert rel.max() < 0.1 and rel.mean() < 0.015, (prompt, rel.max(), rel.mean())
        agree += (a.argmax(-1) == b.argmax(-1)).sum().item()
        total += len(ids)
    # bf16 logits a last bit apart can swap near-ties: 101 of 105 agree with oneDNN's AVX-512
    # bf16 kernels on a Zen 4 (no AMX), more with AMX
    assert agree / total >= 0.95, f"next-token choice agrees at {agree}/{total} positions"


def test_fp32_is_never_packed():
    eng = LLMEngine(EngineConfig(dtype="float32", max_num_seqs=1, weights="dense"))
    assert not eng.model.packed and eng.model.layout == "plain"
    with pytest.raises(ValueError, match="needs a CPU and bfloat16"):
        LlamaModel(eng.model.loaded, eng.device, eng.dtype, 64, layout="onednn")


def test_draft_from_a_packed_target_is_the_plain_targets_draft():
    eng = LLMEngine(_packed_config(max_num_seqs=2,
                                   spec=SpecConfig("draft", num_speculative_tokens=3)))
    assert eng.model.packed
    plain = LLMEngine(EngineConfig(dtype="bfloat16", max_num_seqs=1, pack_weights=False,
                                   weights="dense"))
    # the built-in draft quantizes the plain weights, which stay reachable after packing
    for name, w in plain.model.layers[0].items():
        if name in eng.model.LINEAR_WEIGHTS:
            assert torch.equal(eng.model.plain_linear_weights(0)[name], w)
    a = QuantizedLlama(eng.model, BUILTIN_RECIPE).layers[0]["qkv"]
    cache.clear("draft")  # quantize again, from the plain target this time
    b = QuantizedLlama(plain.model, BUILTIN_RECIPE).layers[0]["qkv"]
    assert a is not b
    assert torch.equal(a.packed, b.packed) and torch.equal(a.scales, b.scales)
    outs = eng.generate(PROMPTS[:2], SamplingParams(max_tokens=12, ignore_eos=True))
    assert [len(o.token_ids) for o in outs] == [12, 12]
    assert eng.allocator.num_free_blocks == eng.allocator.num_blocks
    # the draft (int4 copy of the plain weights) still agrees with the packed target
    assert eng.metrics_snapshot()["acceptance_rate"] > 0.5
