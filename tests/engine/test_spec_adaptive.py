"""Adaptive k (engine/spec/adaptive.py): SpecLength picks the k a known cost model says is best.

Each test runs a simulated server: the step time is a known function of the forward's tokens,
every drafted token is accepted with a known probability, and SpecLength sees only what the
engine would measure. The best k is then computed by brute force from the true model, and
SpecLength must settle on it (its own measuring detours aside)."""

from __future__ import annotations

import random

import pytest

from engine.config import SpecConfig
from engine.spec.adaptive import SpecLength


def true_goodput(k: int, batch: int, accept: list[float], step_s, draft_s: float) -> float:
    """Tokens per second with k drafts per request: accept[i] is the chance draft i is accepted
    once drafts 0..i-1 were."""
    emitted, run = 1.0, 1.0
    for i in range(k):
        run *= accept[i]
        emitted += run
    return batch * emitted / (step_s(batch * (1 + k)) + k * draft_s)


def simulate(length: SpecLength, batch: int, accept: list[float], step_s, draft_s: float,
             steps: int, rng: random.Random) -> list[int]:
    """`steps` decode steps; returns the k chosen at each step that was not a detour."""
    chosen = []
    for _ in range(steps):
        k = length.choose(batch)
        if not length.explored:
            chosen.append(k)
        for _ in range(batch if k else 0):
            n = 0
            while n < k and rng.random() < accept[n]:
                n += 1
            length.observe_request(k, k, n)
        noise = 1 + 0.05 * (rng.random() - 0.5)  # a shared machine: +-2.5%
        length.observe_step(batch * (1 + k), step_s(batch * (1 + k)) * noise,
                            batch if k else 0, k, k * draft_s)
    return chosen


def cpu_step(n: float) -> float:
    """The no-AMX CPU's measured target forward (docs/performance.md, spec bench): 9.4 ms at 1 token,
    11.0 at 2, 14.4 at 4, 24.8 at 8, 46.5 at 16, then linear."""
    pts = [(1, 9.4), (2, 11.0), (4, 14.4), (8, 24.8), (16, 46.5)]
    for (n0, t0), (n1, t1) in zip(pts, pts[1:]):
        if n <= n1:
            return (t0 + (t1 - t0) * (n - n0) / (n1 - n0)) / 1e3
    return (46.5 + 2.7 * (n - 16)) / 1e3


CASES = {
    # a GPU at batch 1: verifying 5 tokens costs what 1 does; a good draft: draft them all
    "memory-bound": (1, [0.8, 0.8, 0.8, 0.8], lambda n: 0.010, 0.0005),
    # every row costs: nothing pays
    "compute-bound": (8, [0.5, 0.5, 0.5, 0.5], lambda n: 0.002 * n, 0.0),
    # this CPU with the EAGLE head's measured per-position acceptance and 1.09 ms a draft
    "cpu-eagle": (1, [0.46, 0.45, 0.42, 0.28], cpu_step, 0.00109),
    # the same at 16 running: the step is compute-bound
    "cpu-eagle-16": (16, [0.46, 0.45, 0.42, 0.28], cpu_step, 0.0015),
    # n-gram on grounded text at batch 1: free drafts accepted 0.6
    "cpu-ngram": (1, [0.75, 0.7, 0.65, 0.6], cpu_step, 0.0001),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_settles_on_the_best_k(case):
    batch, accept, step_s, draft_s = CASES[case]
    goodput = [true_goodput(k, batch, accept, step_s, draft_s) for k in range(5)]
    best = max(range(5), key=goodput.__getitem__)
    length = SpecLength(4)
    chosen = simulate(length, batch, accept, step_s, draft_s, 400, random.Random(0))
    late = chosen[len(chosen) // 2:]
    # near-ties are ties: within 3% of the best (the simulated noise is +-2.5%)
    good = [k for k in range(5) if goodput[k] >= 0.97 * goodput[best]]
    share = sum(late.count(k) for k in good) / len(late)
    assert share >= 0.9, (case, best, goodput, {k: late.count(k) for k in range(5)})
    # its estimate of the tokens per second it gets is within 10% of the truth
    k = max(set(late), key=late.count)
    est = {e.k: e.tokens_per_s for e in length.estimates(batch)}
    assert est[k] == pytest.approx(goodput[k], rel=0.1)


def test_the_cases_cover_every_answer_they_claim():
    """The cases above are not all one answer: k = 0, the full k and something between."""
    best = set()
    for batch, accept, step_s, draft_s in CASES.values():
        g = [true_goodput(k, batch, accept, step_s, draft_s) for k in range(5)]
        best.add(max(range(5), key=g.__getitem__))
    assert 0 in best and 4 in best and best - {0, 4}, best


def test_follows_the_load():
    """Batch 1 then batch 16 on the CPU curve: the choice moves to the new best."""
    batch1, accept, step_s, draft_s = CASES["cpu-eagle"]
    length = SpecLength(4)
    rng = random.Random(1)
    simulate(length, batch1, accept, step_s, draft_s, 300, rng)
    chosen = simulate(length, 16, accept, step_s, 0.0015, 300, rng)
    g = [true_goodput(k, 16, accept, step_s, 0.0015) for k in range(5)]
    good = [k for k in range(5) if g[k] >= 0.97 * max(g)]
    assert sum(chosen[-60:].count(k) for k in good) >= 54, (g, chosen[-60:])


def test_first_steps_draft_everything_then_every_k_is_measured():
    length = SpecLength(4)
    assert length.choose(2) == 4  # nothing measured: every k costs alike, more tokens win
    seen = set()
    for _ in range(8 * 10):
        seen.add(length.choose(2))
        length.observe_step(2, 0.01)
    assert seen == {0, 1, 2, 3, 4}


def test_a_proposer_that_finds_nothing_turns_drafting_off():
    """n-gram on text that never repeats: asked for k, drafted nothing; E(k) = 1 for every k,
    so drafting buys nothing and k = 0 wins once a step was measured."""
    length = SpecLength(4)
    for _ in range(50):
        length.choose(1)
        length.observe_request(4, 0, 0)
        length.observe_step(1, 0.01, 1, 1, 0.001)
    assert length.tokens_per_request(4) == pytest.approx(1.0, abs=0.05)  # the prior, fading
    assert length.choose(1) == 0 or length.explored


def test_accept_share_never_rises_with_depth():
    length = SpecLength(3)
    for _ in range(20):
        length.observe_request(3, 3, 3)
        length.observe_request(1, 1, 0)  # deep positions see only the lucky requests
    shares = [length.accept_share(i) for i in range(3)]
    assert shares == sorted(shares, reverse=True)
    assert 0 < shares[-1] <= 1


def test_step_time_interpolates_and_extends():
    length = SpecLength(4)
    assert length.step_seconds(4) is None
    length.observe_step(2, 0.010)
    length.observe_step(10, 0.030)
    assert length.step_seconds(6) == pytest.approx(0.020)
    assert length.step_seconds(14) == pytest.approx(0.040)  # the line through 2 and 10
    assert length.step_seconds(1) == pytest.approx(0.010)  # below: flat


def test_config_refuses_a_non_boolean():
    with pytest.raises(ValueError, match="adaptive_k"):
        SpecConfig("ngram", adaptive_k="yes")
    with pytest.raises(ValueError, match="k_max"):
        SpecLength(0)
