"""Sampler.sample on hand-made logits: which row each request samples from, min_tokens' mask,
penalties on a copy of its row only, raw logprobs, prompt logprobs, drafts to the verifier.
No model: a ForwardResult and Requests built here, so each rule is checked alone."""

from __future__ import annotations

import math

import pytest
import torch

from engine.config import SamplingParams
from engine.request import Request
from engine.runner import ForwardResult
from engine.sampler import Sampler, SamplerOutput, logit_rows

VOCAB = 8
EOS = 7


def _req(rid: str, params: SamplingParams, prompt=(1, 2, 3), output=(), seed=0) -> Request:
    r = Request(rid, list(prompt), params, generator=torch.Generator().manual_seed(seed))
    r.output_token_ids = list(output)
    if params.prompt_logprobs is not None:
        r.prompt_logprobs = [None]
    return r


def _logits(*best: int) -> torch.Tensor:
    """One row per entry, its largest logit at that id (then id 0 < 1 < ... by a little)."""
    rows = torch.arange(VOCAB, dtype=torch.float32).repeat(len(best), 1) * 0.01
    for i, b in enumerate(best):
        rows[i, b] = 5.0
    return rows


def test_each_request_samples_from_its_last_row():
    # a: rows 0-1 (its last is 1), b: row 2; greedy takes each one's own argmax
    logits = _logits(3, 4, 5)
    reqs = {"a": _req("a", SamplingParams(temperature=0.0)),
            "b": _req("b", SamplingParams(temperature=0.0))}
    out = Sampler({EOS}).sample(ForwardResult(logits, {"a": (0, 1), "b": (2, 1)}), reqs)
    assert isinstance(out, SamplerOutput)
    assert out.sampled == {"a": [3], "b": [5]} and out.records == [] and out.logprobs == {}
    logits = _logits(3, 4, 5)
    # a has 2 rows with no draft: it samples from its last (row 1)
    out = Sampler({EOS}).sample(ForwardResult(logits, {"a": (0, 2), "b": (2, 1)}), reqs)
    assert out.sampled == {"a": [4], "b": [5]}


def test_min_tokens_masks_eos_and_stop_ids_until_reached():
    logits = _logits(EOS, EOS, EOS)
    sp = SamplingParams(temperature=0.0, min_tokens=2, stop_token_ids=[6])
    logits[:, 6] = 4.0  # the second best is a stop token: masked too
    reqs = {"short": _req("short", sp, output=[1]),  # 1 < min_tokens: masked
            "done": _req("done", sp, output=[1, 2]),  # reached: EOS may come
            "ign": _req("ign", SamplingParams(temperature=0.0, min_tokens=2, ignore_eos=True),
                        output=[1])}  # ignore_eos: EOS is not masked (nothing to end)
    sampler = Sampler({EOS})
    assert sampler.masked(reqs["short"]) == [EOS, 6] and sampler.masked(reqs["done"]) == []
    out = sampler.sample(ForwardResult(logits, {"short": (0, 1), "done": (1, 1),
                                                "ign": (2, 1)}), reqs)
    assert out.sampled["short"] == [5]  # the best neither EOS nor a stop id (0.05 > 0.04 ...)
    assert out.sampled["done"] == [EOS] and out.sampled["ign"] == [EOS]


def test_processing_changes_a_copy_of_its_own_row_only():
    logits = _logits(2, 2)
    before = logits.clone()
    reqs = {"pen": _req("pen", SamplingParams(temperature=0.0, frequency_penalty=2.0),
                        output=[2, 2, 2]),  # 5 - 6 < 0.07: token 2 loses its lead
            "plain": _req("plain", SamplingParams(temperature=0.0), output=[2, 2, 2])}
    sampler = Sampler({EOS})
    out = sampler.sample(ForwardResult(logits, {"pen": (0, 1), "plain": (1, 1)}), reqs)
    assert out.sampled == {"pen": [VOCAB - 1], "plain": [2]}
    assert torch.equal(logits, before)  # the forward's logits are never written
    rows = sampler.processed(logits, [reqs["plain"], reqs["plain"]])
    assert rows is logits  # nobody asks: no copy at all
    bias = _req("bias", SamplingParams(temperature=0.0, logit_bias={0: 10.0}))
    rows = sampler.processed(logits, [bias, reqs["plain"]])
    assert rows[0, 0] == pytest.approx(10.0) and torch.equal(rows[1], logits[1])


def test_logprobs_are_raw_and_cut_to_what_each_asked():
    logits = _logits(1, 1)
    reqs = {"a": _req("a", SamplingParams(temperature=0.0, logprobs=2, logit_bias={3: 100.0})),
            "b": _req("b", SamplingParams(temperature=0.0, logprobs=0)),
            }
    out = Sampler({EOS}).sample(ForwardResult(logits, {"a": (0, 1), "b": (1, 1)}), reqs)
    assert out.sampled == {"a": [3], "b": [1]}  # the bias picked 3 for a
    raw = torch.log_softmax(logits, -1)
    (own, alts), = out.logprobs["a"]
    # the logprob of the sampled token from the raw logits (before the bias), and the raw top 2
    assert own == pytest.approx(raw[0, 3].item(), abs=1e-5)
    assert [t for t, _ in alts] == [1, 7] and alts[0][1] == pytest.approx(raw[0, 1].item())
    (own_b, alts_b), = out.logprobs["b"]
    assert own_b == pytest.approx(raw[1, 1].item()) and alts_b == []


def test_prompt_logprobs_go_into_the_request():
    # rows 0-1 predict prompt tokens 2 and 3 (positions 1, 2); row 2 samples
    logits = _logits(2, 0, 4)
    req = _req("p", SamplingParams(temperature=0.0, prompt_logprobs=1), prompt=[1, 2, 3])
    fwd = ForwardResult(logits, {"p": (2, 1)}, prompt_rows={"p": (0, 0, 2)})
    out = Sampler({EOS}).sample(fwd, {"p": req})
    assert out.sampled == {"p": [4]}
    raw = torch.log_softmax(logits, -1)
    assert req.prompt_logprobs[0] is None and len(req.prompt_logprobs) == 3
    (own2, top2), (own3, top3) = req.prompt_logprobs[1:]
    assert own2 == pytest.approx(raw[0, 2].item()) and top2[0][0] == 2
    assert own3 == pytest.approx(raw[1, 3].item()) and top3[0][0] == 0
    assert math.exp(own2) > 0.9 > math.exp(own3)


def test_fork_children_sample_from_their_parents_row_with_their_own_generator():
    logits = torch.zeros(1, VOCAB)  # uniform: each generator draws its own token
    sp = SamplingParams(temperature=1.0)
    parent = _req("g#0", sp, seed=1)
    children = [_req(f"g#{i}", sp, seed=10 + i) for i in (1, 2, 3)]
    parent.fork_children = children
    out = Sampler({EOS}).sample(ForwardResult(logits, {"g#0": (0, 1)}),
                                {"g#0": parent})
    assert list(out.sampled) == ["g#0", "g#1", "g#2", "g#3"]
    for r in [parent, *children]:  # the same draw as each generator's alone
        g = torch.Generator().manual_seed(int(r.generator.initial_seed()))
        want = int(torch.multinomial(torch.full((VOCAB,), 1 / VOCAB), 1, generator=g))
        assert out.sampled[r.request_id] == [want]


def test_a_draft_goes_to_the_verifier_with_its_rows_on_the_host():
    logits = _logits(1, 2, 3, 4)
    seen = []

    def verify(req, rows):
        seen.append((req.request_id, rows.clone()))
        return [9, 9], "record"

    d = _req("d", SamplingParams(temperature=0.0))
    d.spec_token_ids = [2, 3]
    p = _req("p", SamplingParams(temperature=0.0))
    out = Sampler({EOS}, verify).sample(ForwardResult(logits, {"d": (0, 3), "p": (3, 1)}),
                                        {"d": d, "p": p})
    assert out.sampled == {"d": [9, 9], "p": [4]} and out.records == ["record"]
    (rid, rows), = seen
    assert rid == "d" and rows.device.type == "cpu" and torch.equal(rows, logits[:3])


def test_logit_rows_copies_only_when_it_must():
    logits = _logits(0, 1, 2)
    assert logit_rows(logits, [0, 1]).data_ptr() == logits.data_ptr()
    assert torch.equal(logit_rows(logits, [2, 0]), logits[[2, 0]])
