"""The engine's greedy output equals transformers' generate() token for token (fp32)."""

from __future__ import annotations

import pytest

from engine import EngineConfig, LLMEngine, SamplingParams
from tests.conftest import PROMPTS

MAX_TOKENS = 24
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def references(tokenizer, hf_greedy):
    ids = [tokenizer.encode(p, add_special_tokens=False) for p in PROMPTS]
    return ids, [hf_greedy(i, MAX_TOKENS) for i in ids]


def _params():
    return SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)


def test_one_at_a_time(references):
    """The dense fp32 weights (GPUs, Hugging Face folders, pack_weights=False); the other
    tests run weights="auto", on most CPUs the GGUF blocks (tests/engine/test_cpu_matmul.py runs
    those one at a time)."""
    ids, refs = references
    eng = LLMEngine(EngineConfig(dtype="float32", weights="dense", max_num_seqs=1))
    for prompt_ids, ref in zip(ids, refs):
        (out,) = eng.generate([prompt_ids], _params())
        assert out.token_ids == ref, f"prompt {prompt_ids[:8]}..."


def test_all_together(references):
    ids, refs = references
    eng = LLMEngine(EngineConfig(dtype="float32", max_num_seqs=8))
    outs = eng.generate(ids, _params())
    for out, ref in zip(outs, refs):
        assert out.token_ids == ref
    assert eng.allocator.num_free_blocks == eng.allocator.num_blocks, "KV blocks leaked"


def test_chunked_prefill_and_preemption(references):
    """block_size 16, a budget smaller than prompts and a pool too small for everyone."""
    ids, refs = references
    cfg = EngineConfig(dtype="float32", max_num_seqs=8, block_size=16, max_model_len=64,
                       num_kv_blocks=6, max_num_batched_tokens=8)
    eng = LLMEngine(cfg)
    preempted = 0
    for p in ids:
        eng.add_request(p, _params())
    while eng.has_unfinished():
        report = eng.step()
        preempted += len(report.preempted)
    assert preempted > 0, "the pool was meant to be small enough to force preemption"
    for rid, ref in zip(sorted(eng.requests, key=lambda r: int(r[1:])), refs):
        assert eng.requests[rid].output_token_ids == ref, rid
    assert eng.allocator.num_free_blocks == eng.allocator.num_blocks


def test_text_matches_decode_of_ids(tokenizer):
    eng = LLMEngine(EngineConfig(dtype="float32"))
    outs = eng.generate(["我最喜欢的水果是", "Emoji time: 🎉"],
                        SamplingParams(max_tokens=16, ignore_eos=True))
    for out in outs:
        # the text is decode(ids), less an unfinished character at the cut (max_tokens):
        # the detokenizer never ends a text in U+FFFD (tests/test_detokenizer.py)
        whole = tokenizer.decode(out.token_ids)
        held = whole[len(out.text):]
        assert whole.startswith(out.text) and "\ufffd" not in out.text
        assert not held or "\ufffd" in held, (out.text, whole)


def test_engines_share_one_model_and_stay_independent(references):
    """Engines in one process share the read-only weights (the app keeps one engine per
    switch setting); stepped in turns, each still gives the reference tokens."""
    ids, refs = references
    a = LLMEngine(EngineConfig(dtype="float32", max_num_seqs=4))
    b = LLMEngine(EngineConfig(dtype="float32", max_num_seqs=4, batching="static",
                               kv_layout="contiguous", max_model_len=1024))
    assert a.model is b.model and b.model.cos.shape[0] >= 1024
    rids_a = [a.add_request(p, _params()) for p in ids[:4]]
    rids_b = [b.add_request(p, _params()) for p in ids[3:]]
    while a.has_unfinished() or b.has_unfinished():
        for eng in (a, b):
            if eng.has_unfinished():
                eng.step()
    assert [a.output(r).token_ids for r in rids_a] == refs[:4]
    assert [b.output(r).token_ids for r in rids_b] == refs[3:]
