"""The OpenAI fields in the engine: logprobs (raw, vLLM's default), prompt logprobs, n > 1
sharing the prompt's blocks (copy-on-write), penalties, logit_bias, min_tokens,
stop_token_ids, and sampling that cannot produce NaN."""

from __future__ import annotations

import math

import pytest
import torch

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.sampler import probabilities, process
from tests.conftest import assert_blocks_consistent

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is"  # 5 tokens: with block_size 4, one full block, one part


@pytest.fixture(scope="module")
def eng():
    return LLMEngine(EngineConfig(dtype="float32", max_num_seqs=4, block_size=4,
                                  max_model_len=128))


def hf_logprobs(ids: list[int]) -> torch.Tensor:
    """transformers' fp32 log-softmax at every position of ids."""
    from benchmarks.baseline import load_hf

    hf, _ = load_hf("smollm2-135m")
    with torch.no_grad():
        logits = hf(torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits, -1)


def test_n2_shares_prompt_blocks_then_copies_the_partial_one(eng):
    alloc = eng.allocator
    free0 = alloc.num_free_blocks
    rid = eng.add_request(PROMPT, SamplingParams(max_tokens=6, n=2, temperature=1.0, seed=3,
                                                 ignore_eos=True))
    a, b = eng.sample_ids(rid)
    rep = eng.step()  # the prompt, once; both samples take their first token from its logits
    tables = rep.kv.block_tables
    assert tables[a] == tables[b] and len(tables[a]) == 2
    assert [alloc.ref_count[x] for x in tables[a]] == [2, 2]
    shared = {d["block"]: d for d in rep.kv.blocks}
    assert all(shared[x]["state"] == "shared" and sorted(shared[x]["owners"]) == [a, b]
               for x in tables[a])
    assert rep.num_batched_tokens == 5  # the prompt computed once, not twice
    rep = eng.step()  # both write position 5, in the shared partial block: one copies it
    ta, tb = rep.kv.block_tables[a], rep.kv.block_tables[b]
    assert ta[0] == tb[0] and alloc.ref_count[ta[0]] == 2  # the full block stays shared
    assert ta[1] != tb[1] and alloc.ref_count[ta[1]] == alloc.ref_count[tb[1]] == 1
    assert_blocks_consistent(alloc, eng.scheduler.running)
    while not eng.is_finished(rid):
        eng.step()
    out = eng.output(rid)
    assert [s.request_id for s in out.samples] == [a, b]
    assert all(len(s.token_ids) == 6 for s in out.samples)
    assert out.samples[0].token_ids != out.samples[1].token_ids  # seeds 3 and 4 differ
    assert alloc.num_free_blocks == free0  # no block leaked
    eng.forget(rid)
    assert a not in eng.requests and rid not in eng.groups

    # the copied block holds the prompt's KV: each sample equals the same seed run alone
    for i, s in enumerate(out.samples):
        (alone,) = eng.generate([PROMPT], SamplingParams(max_tokens=6, temperature=1.0,
                                                         seed=3 + i, ignore_eos=True))
        assert alone.token_ids == s.token_ids


def test_n_on_contiguous_kv_gives_the_same_samples():
    cont = LLMEngine(EngineConfig(dtype="float32", max_num_seqs=4, block_size=4,
                                  max_model_len=128, kv_layout="contiguous"))
    sp = SamplingParams(max_tokens=5, n=3, temperature=0.8, seed=11, ignore_eos=True)
    (c,) = cont.generate([PROMPT], sp)
    paged = LLMEngine(EngineConfig(dtype="float32", max_num_seqs=4, block_size=4,
                                   max_model_len=128))
    (p,) = paged.generate([PROMPT], sp)
    assert [s.token_ids for s in c.samples] == [s.token_ids for s in p.samples]
    assert cont.allocator.num_free_blocks == cont.allocator.num_blocks


def test_n_too_large_and_abort_of_a_group(eng):
    with pytest.raises(ValueError, match="max_num_seqs"):
        eng.add_request(PROMPT, SamplingParams(n=5))
    free0 = eng.allocator.num_free_blocks
    rid = eng.add_request(PROMPT, SamplingParams(max_tokens=20, n=3, ignore_eos=True))
    eng.abort_request(rid)  # before the fork: the samples never forked end too
    assert eng.is_finished(rid)
    eng.step()
    rid = eng.add_request(PROMPT, SamplingParams(max_tokens=20, n=3, ignore_eos=True))
    eng.step()
    eng.step()
    eng.abort_request(rid)
    eng.step()
    assert eng.allocator.num_free_blocks == free0
    assert not eng.has_unfinished()


def test_logprobs_are_the_raw_model_logprobs(eng):
    sp = SamplingParams(max_tokens=4, logprobs=3, prompt_logprobs=2, ignore_eos=True)
    (out,) = eng.generate([PROMPT], sp)
    ids = out.prompt_token_ids + out.token_ids
    ref = hf_logprobs(ids)
    p = len(out.prompt_token_ids)
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == p
    for j in range(1, p):
        own, top = out.prompt_logprobs[j]
        assert own == pytest.approx(ref[j - 1, ids[j]].item(), abs=2e-3)
        assert [t for t, _ in top] == ref[j - 1].topk(2).indices.tolist()
    assert len(out.logprobs) == 4
    for j, (own, top) in enumerate(out.logprobs):
        row = ref[p - 1 + j]
        assert own == pytest.approx(row[ids[p + j]].item(), abs=2e-3)
        assert top[0][0] == ids[p + j]  # greedy: the sampled token is the most likely
        assert [t for t, _ in top] == row.topk(3).indices.tolist()
        assert all(math.isfinite(v) for _, v in top)

    # chunked prefill reads the same prompt logprobs, chunk by chunk
    small = LLMEngine(EngineConfig(dtype="float32", max_num_seqs=2, block_size=4,
                                   max_model_len=128, max_num_batched_tokens=2))
    (chunked,) = small.generate([PROMPT], sp)
    assert [e and e[0] for e in chunked.prompt_logprobs] == pytest.approx(
        [e and e[0] for e in out.prompt_logprobs], abs=1e-4)
    assert chunked.token_ids == out.token_ids


def test_tiny_temperature_and_top_p_are_greedy_not_nan(eng):
    (greedy,) = eng.generate(["x"], SamplingParams(max_tokens=4, ignore_eos=True))
    for sp in (SamplingParams(max_tokens=4, temperature=1e-40, ignore_eos=True),
               SamplingParams(max_tokens=4, temperature=1.0, top_p=1e-300, ignore_eos=True),
               SamplingParams(max_tokens=4, temperature=1.0, top_p=4.5e-79, ignore_eos=True),
               SamplingParams(max_tokens=4, temperature=2.0, top_k=1, ignore_eos=True)):
        (o,) = eng.generate(["x"], sp)
        assert o.token_ids == greedy.token_ids, sp
    probs = probabilities(torch.tensor([1.0, 3.0, 2.0]),
                          SamplingParams(temperature=1e-3, top_p=1e-300))
    assert torch.equal(probs, torch.tensor([0.0, 1.0, 0.0]))


def test_penalties_bias_and_their_batch_invariance(eng):
    row = torch.zeros(6)
    out = process(row, SamplingParams(presence_penalty=0.5, frequency_penalty=0.25,
                                      logit_bias={5: 3.0}), [1, 1, 2], [4])
    assert out.tolist() == [0.0, -1.0, -0.75, 0.0, float("-inf"), 3.0]
    assert row.tolist() == [0.0] * 6  # a copy: the batch's row is untouched

    plain = SamplingParams(max_tokens=12, ignore_eos=True)
    (alone,) = eng.generate(["The the the the"], plain)
    pen = SamplingParams(max_tokens=12, frequency_penalty=2.0, presence_penalty=2.0,
                         logit_bias={alone.token_ids[0]: -100.0}, ignore_eos=True)
    outs = eng.generate(["The the the the", "The the the the"], [plain, pen])
    assert outs[0].token_ids == alone.token_ids  # its neighbour's penalties change nothing
    assert outs[1].token_ids[0] != alone.token_ids[0]
    assert len(set(outs[1].token_ids)) == len(outs[1].token_ids)  # presence 2: no repeat here


def test_min_tokens_and_stop_token_ids(eng):
    eos = min(eng.eos_ids)
    (o,) = eng.generate([PROMPT], SamplingParams(max_tokens=8, logit_bias={eos: 100.0},
                                                 min_tokens=3))
    assert len(o.token_ids) == 4 and o.token_ids[-1] == eos and o.finish_reason == "eos"
    assert eos not in o.token_ids[:3]
    (g,) = eng.generate([PROMPT], SamplingParams(max_tokens=8, ignore_eos=True))
    (s,) = eng.generate([PROMPT], SamplingParams(max_tokens=8, stop_token_ids=[g.token_ids[2]],
                                                 ignore_eos=True))
    assert s.token_ids == g.token_ids[:3] and s.finish_reason == "stop_token"
    (m,) = eng.generate([PROMPT], SamplingParams(max_tokens=8, min_tokens=4, ignore_eos=True,
                                                 stop_token_ids=[g.token_ids[2]]))
    assert g.token_ids[2] not in m.token_ids[:4]


def test_bad_values_name_the_field(eng):
    vocab = eng.model_config.vocab_size
    for kw, name in (({"logit_bias": {vocab: 1.0}}, "logit_bias"),
                     ({"stop_token_ids": [vocab + 3]}, "stop_token_ids")):
        with pytest.raises(ValueError, match=name):
            eng.add_request(PROMPT, SamplingParams(**kw))
    for kw, name in (({"logit_bias": {1: 101.0}}, "logit_bias"),
                     ({"presence_penalty": 2.5}, "presence_penalty"),
                     ({"frequency_penalty": float("nan")}, "frequency_penalty"),
                     ({"min_tokens": 9, "max_tokens": 8}, "min_tokens"),
                     ({"logprobs": 21}, "logprobs"), ({"n": 0}, "n"),
                     ({"stop_token_ids": [True]}, "stop_token_ids")):
        with pytest.raises(ValueError, match=name):
            SamplingParams(**kw)


def test_n2_with_prefix_caching_and_spec_frees_every_block():
    from engine.config import SpecConfig

    e = LLMEngine(EngineConfig(dtype="float32", max_num_seqs=4, block_size=4,
                               max_model_len=128, enable_prefix_caching=True,
                               spec=SpecConfig("ngram")))
    free0 = e.allocator.num_free_blocks
    outs = e.generate([PROMPT * 3, PROMPT * 3],
                      [SamplingParams(max_tokens=6, n=2, temperature=1.0, seed=1),
                       SamplingParams(max_tokens=6, logprobs=1, prompt_logprobs=0)])
    assert len(outs[0].samples) == 2 and len(outs[1].logprobs) == len(outs[1].token_ids)
    assert e.allocator.num_free_blocks == free0
    assert all(e.allocator.ref_count[b] == 0 for b in range(e.allocator.num_blocks))
