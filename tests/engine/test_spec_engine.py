"""Speculative decoding in the engine: lossless, and every KV block comes back.

Greedy: the tokens are the same with speculation off, with prompt lookup, with the draft
model and with the EAGLE head, alone and batched with sampling requests, in both KV layouts.
The EAGLE head here is trained for a few seconds (`eagle_head`): losslessness does not depend
on the draft's quality, only on the verifier. Sampling: the joint
distribution of the first generated tokens over many seeds matches the target's exact
probabilities (chi-square), on a prompt where the drafts really are checked and often
rejected (Leviathan et al. 2023: the rejection rule keeps the target's distribution).
Rollback: random acceptance patterns never leak or double-own a block.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.workloads import get_workload
from engine import EngineConfig, LLMEngine, SamplingParams, SpecConfig
from engine.kv import ContiguousAllocator, PagedAllocator
from engine.request import Request
from engine.spec import draft as draft_mod
from engine.spec.decoder import SpecDecoder
from engine.spec.draft import (
    GROUP,
    DraftRecipe,
    DraftSeq,
    _common_prefix,
    quant_linear,
    quant_weight,
    quantize_int4,
)
from tests.conftest import PROMPTS, assert_blocks_consistent

# ---------------------------------------------------------------------------------------------
# Fast: no model


steps = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 4), st.integers(0, 4),
                           st.booleans()), min_size=1, max_size=60)


@settings(max_examples=120, deadline=None)
@given(steps=steps, layout=st.sampled_from(["paged", "contiguous"]))
def test_rollback_after_random_acceptance_never_leaks(steps, layout):
    """Drive the allocator as the engine does: ensure slots for [last, *draft], accept a
    random prefix, truncate to the accepted length; a DraftSeq in its own paged pool too."""
    bs, max_len = 4, 40
    alloc = (PagedAllocator(40, bs) if layout == "paged"
             else ContiguousAllocator(40, bs, max_model_len=max_len))
    draft_alloc = PagedAllocator(40, bs)
    live: dict[int, Request] = {}
    seqs: dict[int, DraftSeq] = {}
    for i, k, accepted, finish in steps:
        req = live.get(i)
        if req is None:
            req = Request(f"r{i}", [1, 2, 3, 4, 5][: 2 + i], SamplingParams())
            if not (alloc.admit(req) and alloc.ensure_slots(req, req.num_tokens)):
                alloc.free(req)
                continue
            req.num_computed_tokens = req.num_tokens - 1  # prefilled; the last token is next
            live[i], seqs[i] = req, DraftSeq(req.request_id)
        seq = seqs[i]
        k = min(k, max_len - 1 - req.num_tokens)
        accepted = min(accepted, max(k, 0))
        if k >= 0 and alloc.ensure_slots(req, req.num_tokens + k):
            # the draft holds its K/V up to x_{k-1}, then keeps the accepted prefix
            n_draft = req.num_tokens + k - 1
            if draft_alloc.ensure_slots(seq, n_draft):
                seq.token_ids = list(range(n_draft))
            new = [7] * (accepted + 1)
            req.num_computed_tokens = req.num_tokens + accepted  # last real token + accepted
            alloc.truncate(req, req.num_computed_tokens)
            req.output_token_ids += new
            keep = min(len(seq.token_ids), req.num_tokens - 1)
            del seq.token_ids[keep:]
            draft_alloc.truncate(seq, keep)
            if layout == "paged":
                assert len(req.block_table) == -(-req.num_computed_tokens // bs)
            assert len(seq.block_table) == -(-keep // bs)
        if finish or req.num_tokens >= max_len - 1:
            alloc.free(req)
            draft_alloc.free(seq)
            del live[i], seqs[i]
        assert_blocks_consistent(alloc, live.values())
        assert_blocks_consistent(draft_alloc, seqs.values())
    for i in list(live):
        alloc.free(live.pop(i))
        draft_alloc.free(seqs.pop(i))
    assert alloc.num_free_blocks == alloc.num_blocks
    assert draft_alloc.num_free_blocks == draft_alloc.num_blocks


@given(a=st.lists(st.integers(0, 3), max_size=30), b=st.lists(st.integers(0, 3), max_size=30))
def test_common_prefix(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    assert _common_prefix(a, b) == n


def test_bench_method_names():
    from benchmarks.spec_bench import parse_method
    assert parse_method("off") == ("off", False, False, None)
    assert parse_method("ngram+adaptive") == ("ngram", False, True, None)
    assert parse_method("eagle+lookup+adaptive") == ("eagle", True, True, None)
    assert parse_method("draft+adaptive+lookup") == ("draft", True, True, None)
    assert parse_method("eagle+lookup+adaptive@0.5") == ("eagle", True, True, 0.5)
    for bad in ("off+adaptive", "ngram+lookup", "eagle+lookup+lookup", "eagle+fast", "tree",
                "draft@0.5", "eagle@1.0", "eagle@x", "eagle@"):
        with pytest.raises(ValueError):
            parse_method(bad)


def test_speedup_bound_follows_the_lessons_formula():
    from benchmarks.spec_bench import speedup_bound

    def curve(f):
        return [{"tokens": n, "vs_one_token": f(n)} for n in (1, 2, 4, 8, 16)]

    flat = curve(lambda n: 1.0)  # memory-bound: verifying 16 tokens costs one step
    assert speedup_bound(flat, 0.0) == {"a": 1.0, "draft_ratio": 0.0, "k": 15, "speedup": 16.0}
    assert speedup_bound(curve(float), 0.0)["speedup"] == 1.0  # compute-bound: nothing to win
    b = speedup_bound(flat, 0.1, a=0.5)
    brute = max((sum(0.5 ** i for i in range(k + 1)) / (1 + 0.1 * k), k) for k in range(16))
    assert (b["speedup"], b["k"]) == pytest.approx(brute)
    # between measured sizes T is linear: k = 4 verifies 5 tokens at (1.5 + 2.5) / 2 = 1.75
    b = speedup_bound(curve(lambda n: {1: 1.0, 2: 1.2, 4: 1.5, 8: 2.5, 16: 5.0}[n]), 0.0)
    assert b["k"] == 7 and b["speedup"] == pytest.approx(8 / 2.5)


def test_needed_acceptance_is_the_first_a_that_reaches_the_goal():
    from benchmarks.spec_bench import needed_acceptance, speedup_bound

    flat = [{"tokens": n, "vs_one_token": 1.0} for n in (1, 2, 4, 8, 16)]
    a = needed_acceptance(flat, 0.1, 2.0)
    assert speedup_bound(flat, 0.1, a=a)["speedup"] >= 2.0
    assert speedup_bound(flat, 0.1, a=a - 0.01)["speedup"] < 2.0
    # by hand: at a = 0.71, k = 5 gives (1 + a + ... + a^5) / 1.5 = 2.004; a = 0.70 no k does
    assert a == 0.71
    steep = [{"tokens": n, "vs_one_token": float(n)} for n in (1, 2, 4, 8, 16)]
    assert needed_acceptance(steep, 0.0, 1.5) is None  # verifying costs a step a token
    assert needed_acceptance(flat, 0.0, 1.0) == 0.0


def test_lookup_policies_score_the_first_draft():
    """benchmarks.apprentice_score.policy_hits on a hand-made answer: position by position,
    which policy's first draft equals the next token."""
    from benchmarks.apprentice_score import policy_hits

    seq = [5, 6, 7, 9, 5, 6, 7, 8]  # prompt [5, 6, 7, 9]; answer 5, 6, 7, 8 (drafted at j = 2..5)
    head_tok = [0, 0, 0, 6, 0, 8]  # the head's draft after each position j (for token j + 2)
    head_p = [0.1, 0.1, 0.1, 0.9, 0.2, 0.9]
    hits = policy_hits(seq, 4, head_tok, head_p)
    assert hits["head"] == [False, True, False, True]
    # 2-4 tokens: "7 9" and "9 5" never came before -> the head; "5 6" did -> 7 (right);
    # "5 6 7" did -> 9 (wrong: 8)
    assert hits["lookup2"] == [False, True, True, False]
    # 1 token: "9" never came before -> the head (wrong); "5" -> 6, "6" -> 7, "7" -> 9
    assert hits["lookup1"] == [False, True, True, False]
    # the head where it is sure (p >= 0.7): at the last position its 8 wins over lookup's 9
    assert hits["head>=0.7"] == [False, True, True, True]


def test_draft_length_is_capped_by_model_length_and_max_tokens():
    engine = SimpleNamespace(config=EngineConfig(max_model_len=20))
    dec = SpecDecoder(engine, SpecConfig("ngram", num_speculative_tokens=4))
    for prompt_len in range(1, 19):
        for max_tokens in range(1, 8):
            for out in range(max_tokens):
                req = Request("r", [1] * prompt_len, SamplingParams(max_tokens=max_tokens))
                req.output_token_ids = [2] * out
                if req.num_tokens >= 20:
                    continue
                k = dec.max_draft_len(req)
                assert 0 <= k <= 4
                assert req.num_tokens + k < 20, "drafts past max_model_len"
                assert k <= max_tokens - out - 1, "drafts past max_tokens"
                assert k == min(4, 19 - req.num_tokens, max_tokens - out - 1)


def test_int4_draft_reproduces_q4_1_weights():
    """Weights on a Q4_1 grid (code * scale + min per 32 inputs) come back nearly exactly;
    the packed kernel (few rows) and the dense bf16 path (many rows) agree with fp32."""
    torch.manual_seed(0)
    out_f, in_f = 64, 128
    codes = torch.randint(0, 16, (out_f, in_f // GROUP, GROUP))
    codes[..., 0], codes[..., 1] = 0, 15  # each group spans the full grid, as Q4_1 makes it
    scale = torch.rand(out_f, in_f // GROUP, 1) * 0.01 + 0.001
    low = torch.randn(out_f, in_f // GROUP, 1) * 0.02
    w = (codes * scale + low).reshape(out_f, in_f)  # [out, in]
    got_codes, got_scale, got_low = quantize_int4(w)
    assert torch.equal(got_codes, codes.reshape(out_f, in_f).to(torch.int32)), "codes differ"
    assert torch.allclose(got_scale, scale.squeeze(-1), rtol=1e-5)
    assert torch.allclose(got_low, low.squeeze(-1), rtol=1e-5, atol=1e-7)
    q = quant_weight(w, 4)
    assert torch.allclose(q.dense.float(), w, rtol=2**-8, atol=1e-6), "dense copy != bf16(w)"
    for rows in (1, 3, 64):
        x = torch.randn(rows, in_f)
        ref = x @ w.T  # [rows, out]
        got = quant_linear(x, q)
        err = (got - ref).abs().max() / ref.abs().max()
        assert err < 2e-2, f"{rows} rows: relative error {err:.3g}"
    q8 = quant_weight(w, 8)
    x = torch.randn(2, in_f)
    assert ((quant_linear(x, q8) - x @ w.T).abs().max() / (x @ w.T).abs().max()) < 3e-2


# ---------------------------------------------------------------------------------------------
# Slow: the real model, greedy identity

MAX_TOKENS = [24, 16, 20]


@pytest.fixture(scope="session")
def eagle_head(tmp_path_factory) -> str:
    """An EAGLE head trained for 30 steps (seeded, a few seconds) on the greedy prompts'
    answers and the chi-square prompt: good enough that some drafts are accepted, bad enough
    that many are rejected."""
    from engine.spec.eagle import save_weights
    from engine.spec.train_draft import choose_vocab, features, train
    from tests.conftest import PROMPTS as _P

    eng = LLMEngine(EngineConfig(dtype="float32", max_num_seqs=4))
    seqs = [list(o.prompt_token_ids) + list(o.token_ids)
            for o in eng.generate(_greedy_prompts() + [CHI_PROMPT, _P[0], _P[4]],
                                  SamplingParams(max_tokens=24, ignore_eos=True))]
    feats, labels = features(eng, seqs, lambda n: None)
    vocab = choose_vocab(seqs, 1024, eng.model_config.vocab_size)
    weights = train(eng.model, seqs, feats, labels, vocab, steps=30, seed=0, batch_tokens=512)
    path = tmp_path_factory.mktemp("eagle") / "eagle-test.safetensors"
    save_weights(weights, path)
    return str(path)


def _spec(request, method: str, k: int = 4, **kw) -> SpecConfig:
    """SpecConfig for `method`; "eagle" reads the session's quickly trained head."""
    if method == "eagle":
        kw["draft_model"] = request.getfixturevalue("eagle_head")
    return SpecConfig(method, num_speculative_tokens=k, **kw)


@functools.lru_cache(maxsize=1)
def _greedy_prompts() -> list[str]:
    return [get_workload("grounded", 1).items[0].prompt, PROMPTS[1], PROMPTS[3]]


def _greedy_params() -> list[SamplingParams]:
    return [SamplingParams(max_tokens=n, ignore_eos=True) for n in MAX_TOKENS]


def _sampling_params() -> list[SamplingParams]:
    return [SamplingParams(max_tokens=12, temperature=0.8, top_p=0.9, seed=1, ignore_eos=True),
            SamplingParams(max_tokens=20, temperature=1.0, top_k=20, seed=2, ignore_eos=True)]


def _run(cfg: EngineConfig, prompts, params):
    """Run to the end; returns (engine, outputs, every SpecDecision, preemptions)."""
    eng = LLMEngine(cfg)
    rids = [eng.add_request(p, sp) for p, sp in zip(prompts, params)]
    records, preempted = [], 0
    while eng.has_unfinished():
        report = eng.step()
        records += report.spec
        preempted += len(report.preempted)
    return eng, [eng.output(r) for r in rids], records, preempted


@functools.cache
def _reference(layout: str) -> tuple[tuple[int, ...], ...]:
    cfg = EngineConfig(dtype="float32", kv_layout=layout, max_num_seqs=4)
    _, outs, _, _ = _run(cfg, _greedy_prompts(), _greedy_params())
    return tuple(tuple(o.token_ids) for o in outs)


def _check_records(records, k: int) -> None:
    for r in records:
        flags = [d.accepted for d in r.drafted]
        assert 1 <= len(flags) <= k
        assert flags == [True] * r.num_accepted + [False] * (len(flags) - r.num_accepted)
        assert r.next_kind == ("bonus" if r.num_accepted == len(flags) else "correction")
        for d in r.drafted:
            assert d.p_target is not None and 0.0 <= d.p_target <= 1.0 + 1e-6
            assert d.p_draft is not None and 0.0 <= d.p_draft <= 1.0 + 1e-6


def _check_all_free(eng: LLMEngine) -> None:
    assert eng.allocator.num_free_blocks == eng.allocator.num_blocks, "target KV leaked"
    draft = eng.spec_decoder.draft
    if draft is not None:
        assert not draft.seqs, f"draft state left for {sorted(draft.seqs)}"
        assert not getattr(draft, "buffers", None), "EAGLE feature buffers left"
        assert draft.allocator.num_free_blocks == draft.allocator.num_blocks, "draft KV leaked"


@pytest.mark.slow
@pytest.mark.parametrize(("method", "layout"), [
    ("ngram", "paged"), ("ngram", "contiguous"), ("draft", "paged"), ("draft", "contiguous"),
    ("eagle", "paged"), ("eagle", "contiguous")])
def test_greedy_identity_in_a_mixed_batch(method, layout, request):
    """Greedy requests of different lengths next to sampling requests: the greedy tokens are
    exactly the spec-off tokens; drafts were proposed and some accepted."""
    k = 4
    cfg = EngineConfig(dtype="float32", kv_layout=layout, max_num_seqs=8,
                       spec=_spec(request, method, k))
    prompts = _greedy_prompts() + [PROMPTS[0], PROMPTS[4]]
    eng, outs, records, _ = _run(cfg, prompts, _greedy_params() + _sampling_params())
    for out, ref in zip(outs, _reference(layout)):
        assert tuple(out.token_ids) == ref, f"{method}/{layout}: greedy output changed"
    for out, sp in zip(outs[3:], _sampling_params()):
        assert len(out.token_ids) == sp.max_tokens
    assert records, "nothing was drafted"
    assert sum(r.num_accepted for r in records) > 0, "no draft token was ever accepted"
    _check_records(records, k)
    snap = eng.metrics_snapshot()
    assert snap["acceptance_rate"] is not None and 0 < snap["acceptance_rate"] <= 1
    assert 1 <= len(snap["acceptance_by_position"]) <= k
    # the bench's a (RunMetrics) is the page's a (spec_summary over the step reports)
    from app.components.spec_strip import spec_summary

    page = spec_summary([{"spec": [dataclasses.asdict(r) for r in records]}])
    assert snap["a"] == pytest.approx(page["a"]) and 0 < snap["a"] <= 1
    _check_all_free(eng)


@pytest.mark.slow
def test_the_heads_confidence_stop_drafts_only_what_it_trusts(request):
    """SpecConfig(min_confidence=c) with the EAGLE head: a greedy request drafts only tokens
    the head gives at least c (it stops before the first it doubts, so a step may draft
    nothing), the greedy tokens stay the spec-off tokens, and no KV leaks. c is the median
    probability the head gave its drafts without the stop, so half of those were doubted:
    the stop is what keeps them out."""
    k = 4

    def drafted_probs(conf: float) -> list[float]:
        cfg = EngineConfig(dtype="float32", max_num_seqs=4,
                           spec=_spec(request, "eagle", k, min_confidence=conf))
        eng, outs, records, _ = _run(cfg, _greedy_prompts(), _greedy_params())
        for out, ref in zip(outs, _reference("paged")):
            assert tuple(out.token_ids) == ref, f"min_confidence {conf}: greedy output changed"
        _check_all_free(eng)
        probs = [d.p_draft for r in records for d in r.drafted]
        assert all(p is not None for p in probs)
        return probs

    free = sorted(drafted_probs(0.0))
    c = free[len(free) // 2]
    assert len(free) >= 10 and free[0] < c < 1.0, free
    stopped = drafted_probs(c)
    assert stopped and min(stopped) >= c, "a token the head doubted was drafted"
    assert len(stopped) < len(free)


@pytest.mark.slow
def test_prompt_lookup_first_drafts_by_lookup_where_it_matches(request):
    """SpecConfig(prompt_lookup_first=True): a request whose text has an n-gram match this
    step drafts the lookup's tokens, every other one the EAGLE head's; both kinds happen in
    one batch (a grounded prompt that copies, open ones that do not), the greedy tokens are
    exactly the spec-off tokens, sampling requests keep their lengths, and no KV leaks."""
    k = 4
    cfg = EngineConfig(dtype="float32", max_num_seqs=8,
                       spec=_spec(request, "eagle", k, prompt_lookup_first=True))
    eng = LLMEngine(cfg)
    dec = eng.spec_decoder
    by_lookup, by_model = [], []
    lookup_propose, model_propose = dec.ngram.propose, dec.draft.propose

    def lookup(token_ids_list, k=None):
        drafts = lookup_propose(token_ids_list, k)
        by_lookup.extend(d for d in drafts if d)
        return drafts

    def model(reqs, ks):
        for req in reqs:  # the model is only asked where the lookup found nothing
            assert not lookup_propose([req.all_token_ids], k)[0], req.request_id
        by_model.extend(r.request_id for r in reqs)
        return model_propose(reqs, ks)

    dec.ngram.propose, dec.draft.propose = lookup, model
    prompts = _greedy_prompts() + [PROMPTS[0], PROMPTS[4]]
    rids = [eng.add_request(p, sp) for p, sp in zip(prompts, _greedy_params()
                                                    + _sampling_params())]
    records = []
    while eng.has_unfinished():
        records += eng.step().spec
    outs = [eng.output(r) for r in rids]
    for out, ref in zip(outs, _reference("paged")):
        assert tuple(out.token_ids) == ref, "greedy output changed with lookup in front"
    for out, sp in zip(outs[3:], _sampling_params()):
        assert len(out.token_ids) == sp.max_tokens
    assert by_lookup and by_model, (len(by_lookup), len(by_model))
    assert {r.source for r in records} == {"lookup", "model"}  # each record says who drafted
    assert sum(r.num_accepted for r in records) > 0
    _check_records(records, k)
    _check_all_free(eng)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["ngram", "eagle"])
def test_adaptive_k_keeps_the_greedy_tokens(method, request):
    """Adaptive k (engine/spec/adaptive.py) changes k from step to step, down to 0 (no draft
    at all, the EAGLE head then catches up on the next draft): the greedy tokens are still
    exactly the spec-off tokens, every step's report says the k it used, and no KV leaks."""
    cfg = EngineConfig(dtype="float32", max_num_seqs=8,
                       spec=_spec(request, method, 4, adaptive_k=True))
    eng = LLMEngine(cfg)
    prompts = _greedy_prompts() + [PROMPTS[0], PROMPTS[4]]
    rids = [eng.add_request(p, sp) for p, sp in zip(prompts, _greedy_params()
                                                    + _sampling_params())]
    ks, explored, records = [], 0, []
    while eng.has_unfinished():
        report = eng.step()
        records += report.spec
        plan = report.spec_plan
        assert plan["adaptive"] and 0 <= plan["k"] <= 4
        for r in report.spec:
            assert len(r.drafted) <= plan["k"]
        if any(r.request_id in eng.spec_decoder._decoding for r in eng.scheduler.running):
            ks.append(plan["k"])
            explored += plan["explored"]
            assert [e["k"] for e in plan["estimates"]] == list(range(5))
    outs = [eng.output(r) for r in rids]
    for out, ref in zip(outs, _reference("paged")):
        assert tuple(out.token_ids) == ref, f"{method}: greedy output changed under adaptive k"
    assert len(set(ks)) >= 2 and explored >= 1, ks  # k moved, and the detours measured others
    assert sum(r.num_accepted for r in records) > 0
    assert eng.spec_decoder.length.step_s, "no decode step was timed"
    assert eng.spec_decoder.length.draft_s, "no drafting was timed"
    _check_records(records, 4)
    _check_all_free(eng)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["ngram", "draft", "eagle"])
def test_greedy_identity_alone(method, request):
    cfg = EngineConfig(dtype="float32", max_num_seqs=1, spec=_spec(request, method))
    eng, outs, records, _ = _run(cfg, _greedy_prompts()[:1], _greedy_params()[:1])
    assert tuple(outs[0].token_ids) == _reference("paged")[0]
    assert records
    _check_all_free(eng)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["draft", "eagle"])
def test_draft_model_through_chunked_prefill_and_preemption(method, request):
    """A pool too small for everyone and a small token budget: requests are preempted while
    speculating; the draft's state follows (freed, rebuilt) and greedy output is unchanged.
    The EAGLE head gets the target's features chunk by chunk and again after a preemption."""
    cfg = EngineConfig(dtype="float32", max_num_seqs=3, block_size=16, max_model_len=128,
                       num_kv_blocks=9, max_num_batched_tokens=32,
                       spec=_spec(request, method, 3))
    eng, outs, records, preempted = _run(cfg, _greedy_prompts(), _greedy_params())
    assert preempted > 0, "the pool was meant to force preemption"
    assert records
    for out, ref in zip(outs, _reference("paged")):
        assert tuple(out.token_ids) == ref
    _check_all_free(eng)


@pytest.mark.slow
def test_draft_model_from_a_local_folder():
    """SpecConfig.draft_model takes any local folder the loader accepts (here the target's
    own: every greedy draft token is accepted)."""
    from engine.model.loader import hf_folder

    cfg = EngineConfig(dtype="float32", max_num_seqs=2,
                       spec=SpecConfig("draft", 3, draft_model=str(hf_folder("smollm2-135m"))))
    eng, outs, records, _ = _run(cfg, _greedy_prompts()[:1], _greedy_params()[:1])
    assert tuple(outs[0].token_ids) == _reference("paged")[0]
    assert records and all(r.num_accepted == len(r.drafted) for r in records)
    _check_all_free(eng)


# ---------------------------------------------------------------------------------------------
# Slow: the sampled distribution is the target's

CHI_PROMPT = "Numbers: 3 7 1 9 4 3 7 1 9 4 3 7 1 9 4 3"  # next: " " (0.8), then 7/1/9/3/4
NUM_SEEDS = 384


def _chi_params(seed: int) -> SamplingParams:
    return SamplingParams(max_tokens=3, temperature=1.0, top_k=5, seed=seed, ignore_eos=True)


@functools.lru_cache(maxsize=8)
def _target_probs(ids: tuple[int, ...]) -> dict[int, float]:
    """The exact distribution the sampler draws the next token from (transformers, fp32)."""
    from benchmarks.baseline import load_hf
    from engine.sampler import probabilities

    hf, _ = load_hf("smollm2-135m", torch.float32)
    with torch.no_grad():
        logits = hf(torch.tensor([list(ids)])).logits[0, -1].float()  # [vocab]
    p = probabilities(logits, _chi_params(0))
    return {int(t): float(p[t]) for t in torch.nonzero(p).flatten()}


def _chi_square(observed: dict, expected: dict) -> float:
    """p-value of Pearson's test; cells expected below 5 are pooled into one."""
    from scipy.stats import chi2

    cells = [(observed.get(c, 0), e) for c, e in expected.items() if e >= 5]
    pooled_o = sum(observed.get(c, 0) for c, e in expected.items() if e < 5)
    pooled_o += sum(n for c, n in observed.items() if c not in expected)
    pooled_e = sum(e for e in expected.values() if e < 5)
    if pooled_e > 0:
        cells.append((pooled_o, pooled_e))
    else:
        assert pooled_o == 0, "a token the target never samples was emitted"
    stat = sum((o - e) ** 2 / e for o, e in cells)
    return float(chi2.sf(stat, len(cells) - 1))


@pytest.mark.slow
@pytest.mark.parametrize("method", ["ngram", "draft", "eagle"])
def test_sampled_tokens_follow_the_target_distribution(method, monkeypatch, tokenizer, request):
    """384 seeds, temperature 1, top-k 5, three tokens each. The first token comes from the
    prefill (no draft); the second is drafted (1 token, capped by max_tokens) and verified
    by the rejection rule; when accepted, the third is the bonus. The joint (t1, t2) counts
    and t3 after the commonest (t1, t2) must match the target's exact probabilities.

    The draft model here is deliberately weak (the target's first 24 layers, int8: it agrees
    with the target ~35% of the time) so that rejections and corrections are frequent."""
    if method == "draft":
        monkeypatch.setattr(draft_mod, "BUILTIN_RECIPE", DraftRecipe(8, 8, num_layers=24))
    cfg = EngineConfig(dtype="float32", max_num_seqs=32, max_model_len=64, block_size=16,
                       enable_prefix_caching=True, spec=_spec(request, method, 2))
    ids = tokenizer.encode(CHI_PROMPT, add_special_tokens=False)
    eng, outs, records, _ = _run(cfg, [ids] * NUM_SEEDS,
                                 [_chi_params(s) for s in range(NUM_SEEDS)])
    drafted = sum(len(r.drafted) for r in records)
    rejected = sum(r.num_accepted < len(r.drafted) for r in records)
    accepted = sum(r.num_accepted for r in records)
    assert drafted > NUM_SEEDS // 2, f"only {drafted} drafted tokens: speculation not exercised"
    assert rejected > 20 and accepted > 20, (rejected, accepted)
    _check_all_free(eng)

    p1 = _target_probs(tuple(ids))
    joint = {(a, b): NUM_SEEDS * pa * pb for a, pa in p1.items()
             for b, pb in _target_probs(tuple(ids) + (a,)).items()}
    observed: dict = {}
    for o in outs:
        key = (o.token_ids[0], o.token_ids[1])
        observed[key] = observed.get(key, 0) + 1
    p_joint = _chi_square(observed, joint)
    assert p_joint > 1e-3, f"(t1, t2) distribution differs from the target's: p = {p_joint:.2g}"

    top = max(joint, key=joint.get)
    thirds: dict = {}
    for o in outs:
        if (o.token_ids[0], o.token_ids[1]) == top:
            thirds[o.token_ids[2]] = thirds.get(o.token_ids[2], 0) + 1
    n_top = sum(thirds.values())
    p3 = _target_probs(tuple(ids) + top)
    p_third = _chi_square(thirds, {t: n_top * p for t, p in p3.items()})
    assert p_third > 1e-3, f"t3 distribution differs from the target's: p = {p_third:.2g}"
    assert not math.isnan(p_joint)


@pytest.mark.slow
def test_spec_bench_writes_the_main_bench_json_shape(tmp_path):
    from benchmarks.common import RESULT_KEYS
    from benchmarks.spec_bench import main

    out = tmp_path / "spec.json"
    assert main(["--quick", "--concurrency", "2", "--workloads", "grounded", "--max-tokens", "4",
                 "--min-requests", "1", "--methods", "off,ngram,draft,ngram+adaptive",
                 "--repeats", "2", "--json", str(out)]) == 0
    import json

    data = json.loads(out.read_text())
    assert set(data) >= {"machine", "roofline", "results", "forward_cost"}
    assert [c["tokens"] for c in data["forward_cost"]] == [1, 2, 4, 8, 16]
    assert all(c["ms"] > 0 for c in data["forward_cost"])
    assert {r["spec"] for r in data["results"]} == {None, "ngram", "draft", "ngram+adaptive"}
    shares = {r["spec"]: r["k_share"] for r in data["results"]}
    assert shares[None] is None and set(shares["ngram"]) == {"4"}  # JSON keys
    assert sum(shares["ngram+adaptive"].values()) == pytest.approx(1.0)
    for r in data["results"]:
        for key in (*RESULT_KEYS, "workload", "concurrency", "acceptance_rate",
                    "mean_accepted_len", "speedup_vs_off"):
            assert key in r, key
    assert {r["output_tokens"] for r in data["results"]} == {2 * 4}, "unequal work"
    assert {r["repeats"] for r in data["results"]} == {2}  # the fastest of two runs each
    assert all(r["concurrency"] == 2 and r["workload"] == "grounded" for r in data["results"])
    assert data["date"][:4].isdigit()
    bounds = data["speedup_bound"]  # every draft accepted, at each draft's measured cost
    assert set(bounds) == {"free (prompt lookup)", "draft"}
    assert bounds["free (prompt lookup)"]["speedup"] >= bounds["draft"]["speedup"] >= 1.0
    for b in bounds.values():  # the a each speedup goal needs (None: none reaches it)
        assert set(b["needed_a"]) == {"1.5", "2.0"}
        assert all(a is None or 0 <= a <= 1 for a in b["needed_a"].values())
    assert all(r["a"] is None for r in data["results"] if r["spec"] is None)
    a_of = [r["a"] for r in data["results"] if r["a"] is not None]
    assert a_of and all(0 <= a <= 1 for a in a_of)  # the lesson's a, where drafts were verified
