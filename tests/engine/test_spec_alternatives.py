"""The target's top alternatives in the speculation records: what each drafted token had to
match, and the row the correction or bonus token came from.

Fast: the records on synthetic distributions equal a direct top-k of the same rows. Slow: in
a real engine (fp32, prompt lookup, greedy and sampling requests in one batch) every
recorded alternative equals the top-k of the distribution transformers computes on the same
prefix, and the records are consistent with the decision's own numbers.
"""

from __future__ import annotations

import pytest
import torch

from engine import EngineConfig, LLMEngine, SamplingParams, SpecConfig
from engine.spec.decoder import TOP_ALTERNATIVES, SpecDecoder
from engine.spec.rejection import (
    DraftToken,
    SpecDecision,
    greedy_decision,
    rejection_sample,
    top_of,
)

V = 50


def _rows(seed: int, n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(3 * torch.randn(n, V, generator=g), dim=-1)


def _check_consistent(rec: SpecDecision, n_top: int = TOP_ALTERNATIVES) -> None:
    """Sorted, at most n_top, mass at most 1; the drafted token's p_target and the next
    token's next_p equal their entries where they are among the top."""
    for d in rec.drafted[:rec.num_accepted + 1]:
        assert 1 <= len(d.top) <= n_top
        ps = [a.p for a in d.top]
        assert ps == sorted(ps, reverse=True) and sum(ps) <= 1 + 1e-6
        for a in d.top:
            if a.token_id == d.token_id:
                assert a.p == pytest.approx(d.p_target, abs=1e-6)
    for d in rec.drafted[rec.num_accepted + 1:]:
        assert d.top == [], "a discarded token was never checked: no row to show"
    ps = [a.p for a in rec.next_top]
    assert 1 <= len(ps) <= n_top and ps == sorted(ps, reverse=True) and sum(ps) <= 1 + 1e-6
    for a in rec.next_top:
        if a.token_id == rec.next_token_id:
            assert a.p == pytest.approx(rec.next_p, abs=1e-6)


def test_top_of_is_the_rows_topk():
    p = _rows(0, 4)
    vals, ids = p.topk(3, dim=-1)
    got = top_of(p, 3)
    assert [[i for i, _ in row] for row in got] == ids.tolist()
    assert [q for row in got for _, q in row] == pytest.approx(vals.flatten().tolist())
    assert top_of(p[:0], 3) == [] and top_of(p, 0) == [[] for _ in range(4)]


@pytest.mark.parametrize("seed", range(12))
def test_records_equal_a_direct_topk_of_the_verifiers_rows(seed):
    """Sampling: the rows the rejection rule read; greedy: the softmax rows the record shows.
    Checked positions get rows 0..num_accepted, the next token the row num_accepted."""
    k = 4
    p_target, p_draft = _rows(seed, k + 1), _rows(100 + seed, k)
    draft = [int(torch.multinomial(p_draft[i], 1, generator=torch.Generator().manual_seed(i)))
             for i in range(k)]
    for rec in (rejection_sample(draft, p_target, p_draft, torch.Generator().manual_seed(seed)),
                greedy_decision(draft, p_target.argmax(-1), p_target=p_target)):
        SpecDecoder._record_alternatives(rec, p_target)
        vals, ids = p_target.topk(TOP_ALTERNATIVES, dim=-1)
        n = rec.num_accepted
        for i, d in enumerate(rec.drafted[:n + 1]):
            assert [a.token_id for a in d.top] == ids[i].tolist()
            assert [a.p for a in d.top] == pytest.approx(vals[i].tolist())
        assert [a.token_id for a in rec.next_top] == ids[n].tolist()
        assert rec.next_p == pytest.approx(float(p_target[n, rec.next_token_id]))
        _check_consistent(rec)


def test_old_records_without_alternatives_still_build():
    """Records written before the alternatives existed (no top, next_p, next_top) load."""
    old = {"token_id": 5, "p_target": 0.5, "p_draft": 1.0, "accept_prob": 0.5,
           "accepted": True, "text": "x"}
    rec = SpecDecision(drafted=[DraftToken(**old)], num_accepted=1, next_token_id=6,
                       next_kind="bonus")
    assert rec.next_top == [] and rec.next_p is None and rec.drafted[0].top == []
    d = rec.to_dict()
    assert d["next_top"] == [] and d["drafted"][0]["top"] == []


# ---------------------------------------------------------------------------------------------
# Slow: the real model, checked against transformers on the same prefixes

REPEAT = "red green blue yellow red green blue yellow red green blue yellow red green"


@pytest.mark.slow
def test_engine_alternatives_equal_transformers_on_the_same_prefix(tokenizer):
    from benchmarks.baseline import load_hf
    from engine.sampler import probabilities

    greedy = SamplingParams(max_tokens=16, ignore_eos=True)
    sampled = SamplingParams(max_tokens=16, temperature=0.8, top_k=20, seed=3, ignore_eos=True)
    prompts = [tokenizer.encode(p, add_special_tokens=False)
               for p in (REPEAT, "1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4, 1, 2", REPEAT)]
    params = [greedy, greedy, sampled]
    eng = LLMEngine(EngineConfig(dtype="float32", max_num_seqs=4,
                                 spec=SpecConfig("ngram", num_speculative_tokens=3)))
    rids = [eng.add_request(p, sp) for p, sp in zip(prompts, params)]
    so_far = {rid: list(p) for rid, p in zip(rids, prompts)}  # the tokens before this step
    checks = []  # (prefix, params, row top, its token or None)
    while eng.has_unfinished():
        report = eng.step()
        for rec in report.spec:
            _check_consistent(rec)
            prefix, sp = so_far[rec.request_id], params[rids.index(rec.request_id)]
            for i, d in enumerate(rec.drafted[:rec.num_accepted + 1]):
                checks.append((prefix + rec.accepted_tokens[:i], sp, d.top))
            checks.append((prefix + rec.accepted_tokens, sp, rec.next_top))
            assert rec.next_p is not None and 0 < rec.next_p <= 1
            if sp.greedy:  # the argmax is the most likely token of its row
                assert rec.next_top[0].token_id == rec.next_token_id
            for alt in [*(a for d in rec.drafted for a in d.top), *rec.next_top]:
                assert alt.text == tokenizer.decode([alt.token_id])
        for e in report.emitted:
            so_far[e.request_id] += e.token_ids
    kinds = {(sp.greedy, len(top)) for _, sp, top in checks}
    assert {(True, TOP_ALTERNATIVES), (False, TOP_ALTERNATIVES)} <= kinds, "both kinds checked"

    hf, _ = load_hf("smollm2-135m", torch.float32)
    for prefix, sp, top in checks:
        with torch.no_grad():
            logits = hf(torch.tensor([prefix])).logits[0, -1].float()
        want = torch.softmax(logits, -1) if sp.greedy else probabilities(logits, sp)
        vals, ids = want.topk(TOP_ALTERNATIVES)
        # the same probabilities, in order; each recorded id has its recorded probability
        assert [a.p for a in top] == pytest.approx(vals.tolist(), abs=1e-4)
        for a in top:
            assert float(want[a.token_id]) == pytest.approx(a.p, abs=1e-4)
