"""Packed bf16 weights compute the same model as plain ones.

`LlamaModel(loaded, plan, ...)` lays the linear weights out once, as the plan's row of
engine/model/layouts.py says (its pack, engine/model/cpu/packing.py), for our C++ bf16 matmuls: AMX tiles where the CPU has them, else the weight-streaming matmul
("bf16"); the C++ layer loop then runs decode steps too. The matmuls accumulate in another
order than F.linear, so the
bf16 logits may differ in the last bits, never in substance: the next-token choice agrees,
the logits agree to bf16 precision, and the built-in draft, which quantizes the plain
weights, is the same whether the target is packed or not.
"""

from __future__ import annotations

import pytest
import torch

from engine import EngineConfig, LLMEngine, SamplingParams, SpecConfig
from engine.model import weights_cache
from engine.model.cpu import library
from engine.spec.draft import BUILTIN_RECIPE, QuantizedLlama
from tests.conftest import PROMPTS, teacher_forced_logits

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not library.load() or library.matmul_isa() == "portable",
                       reason="no C++ bf16 matmul here (the kernels did not build, or only the "
                              "portable path runs)"),
]


def _packed_config(**kw) -> EngineConfig:
    """A bf16 engine whose weights are laid out for our C++ matmul: AMX tiles where the CPU
    has them, else the weight-streaming matmul ("bf16")."""
    return EngineConfig(dtype="bfloat16", weights="dense", **kw)


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
        # bf16 roundings in another order over 30 layers stay in the hundredths of the
        # position's largest logit; wrong weights or layout give tenths
        assert rel.max() < 0.1 and rel.mean() < 0.015, (prompt, rel.max(), rel.mean())
        agree += (a.argmax(-1) == b.argmax(-1)).sum().item()
        total += len(ids)
    # bf16 logits a last bit apart can swap near-ties, so a few positions may differ
    assert agree / total >= 0.95, f"next-token choice agrees at {agree}/{total} positions"


def test_fp32_is_never_packed():
    eng = LLMEngine(EngineConfig(dtype="float32", max_num_seqs=1, weights="dense"))
    assert not eng.model.packed and eng.model.layout == "plain"
    assert eng.model.row is eng.plan.row and eng.model.isa is None
    # the rows refuse what they cannot run: the plan asks them once (engine/plan.py)
    from engine.model.layouts import LAYOUTS

    assert LAYOUTS["bf16"].refusal("cpu", "float32", True, []).startswith("runs bfloat16")
    assert "onednn" not in LAYOUTS


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
    a = QuantizedLlama(eng.model, BUILTIN_RECIPE, eng.plan.torch_draft_dtype).layers[0]["qkv"]
    weights_cache.clear("draft")  # quantize again, from the plain target this time
    b = QuantizedLlama(plain.model, BUILTIN_RECIPE, plain.plan.torch_draft_dtype
                       ).layers[0]["qkv"]
    assert a is not b
    assert torch.equal(a.packed, b.packed) and torch.equal(a.scales, b.scales)
    outs = eng.generate(PROMPTS[:2], SamplingParams(max_tokens=12, ignore_eos=True))
    assert [len(o.token_ids) for o in outs] == [12, 12]
    assert eng.allocator.num_free_blocks == eng.allocator.num_blocks
    # the draft (int4 copy of the plain weights) still agrees with the packed target
    assert eng.metrics_snapshot()["acceptance_rate"] > 0.5
