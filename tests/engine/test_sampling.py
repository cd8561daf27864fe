"""Seeded sampling is reproducible whatever else is in the batch."""

from __future__ import annotations

import pytest
import torch

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.sampler import argmax, probabilities, sample, sample_rows

pytestmark = pytest.mark.slow


def test_same_seed_same_tokens_in_any_batch():
    eng = LLMEngine(EngineConfig(dtype="float32", max_num_seqs=8))
    p = SamplingParams(max_tokens=16, temperature=0.9, top_p=0.95, top_k=50, seed=1234,
                       ignore_eos=True)
    (alone,) = eng.generate(["Write a short poem about the sea."], p)
    others = [SamplingParams(max_tokens=12, temperature=1.0, seed=s, ignore_eos=True)
              for s in range(5)]
    prompts = ["Hello", "Write a short poem about the sea.", "1, 2, 3,", "def f(x):", "猫", "A"]
    outs = eng.generate(prompts, [others[0], p, *others[1:]])
    assert outs[1].token_ids == alone.token_ids
    assert len({tuple(o.token_ids) for o in outs}) > 1


def test_top_k_top_p_filter():
    logits = torch.tensor([3.0, 2.0, 1.0, 0.0])
    probs = probabilities(logits, SamplingParams(temperature=1.0, top_k=2))
    assert probs[2:].sum() == 0 and torch.isclose(probs.sum(), torch.tensor(1.0))
    probs = probabilities(logits, SamplingParams(temperature=1.0, top_p=0.5))
    assert probs[0] == 1.0, "the top token alone already holds over half the mass"
    greedy = probabilities(logits, SamplingParams(temperature=0.0))
    assert greedy.tolist() == [1.0, 0.0, 0.0, 0.0]


def test_fast_argmax_agrees_with_torch_including_ties():
    g = torch.Generator().manual_seed(0)
    for trial in range(200):
        row = torch.randn(49152, generator=g)
        if trial % 2:  # several equal maxima: the first one wins in both
            idx = torch.randint(0, 49152, (3,), generator=g)
            row[idx] = 50.0
        assert argmax(row) == int(row.argmax())
    view = torch.randn(4, 64, generator=g)[2]  # a row of a batch, as the engine passes it
    assert argmax(view) == int(view.argmax())
    assert argmax(torch.tensor([1.0, 3.0, 3.0], dtype=torch.bfloat16)) == 1


def test_sample_rows_matches_sampling_each_row_alone():
    """Greedy rows share one argmax call; the result is what each row alone gives, ties
    included, and sampled rows draw from their own generators as before."""
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(6, 49152, generator=g)
    logits[1, [7, 9000]] = 50.0  # a tie: the first maximum wins
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.0),
              SamplingParams(temperature=0.8, seed=3), SamplingParams(temperature=0.0),
              SamplingParams(temperature=1.0, top_k=5, seed=4), SamplingParams(temperature=0.0)]
    gens = [torch.Generator().manual_seed(i) for i in range(6)]
    alone_gens = [torch.Generator().manual_seed(i) for i in range(6)]
    alone = [sample(logits[i], p, alone_gens[i]) for i, p in enumerate(params)]
    assert sample_rows(logits, params, gens) == alone
    assert alone[1] == 7
