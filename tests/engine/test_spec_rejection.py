"""The verifier: greedy matching, and rejection sampling that provably loses nothing.

The losslessness tests simulate a real draft/target pair on a small vocabulary: both are
Markov chains (the next-token distribution depends on the previous token), the draft samples
its k tokens from p_draft one after another, the target "runs" over [last, *draft] and gives
k + 1 distributions, and `rejection_sample_batch` (the same core `rejection_sample` calls)
decides. Steps repeat until every row has emitted two tokens. A chi-square test then
compares the first token with the target's p_target and the first two with the target's
two-step joint distribution p_target(a) * p_target(b | a). The same harness, with one piece
of the rule swapped for a plausible wrong one, must fail.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from engine.spec import rejection
from engine.spec.rejection import (
    SpecDecision,
    greedy_decision,
    rejection_sample,
    rejection_sample_batch,
    verify_greedy,
)

V = 12  # vocabulary size of the synthetic models
NUM_ROWS = 100_000  # independent generations per losslessness test
P_MIN = 1e-3  # a correct rule passes above this


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Many small ops: one thread is ~8x faster than two on a busy 2-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ---------------------------------------------------------------------------------------------
# Synthetic target/draft pairs: [V + 1, V] transition tables; row V is the first-token row


def _normalize(p: torch.Tensor) -> torch.Tensor:
    return p / p.sum(dim=-1, keepdim=True)


def _dirichlet(gen: torch.Generator, rows: int, support: slice = slice(None)) -> torch.Tensor:
    p = torch.zeros(rows, V, dtype=torch.float32)
    width = len(range(V)[support])
    p[:, support] = -torch.rand(rows, width, generator=gen, dtype=torch.float32).log()
    return _normalize(p)


def _peaked(gen: torch.Generator, rows: int) -> torch.Tensor:
    return torch.softmax(3.0 * torch.randn(rows, V, generator=gen, dtype=torch.float32), dim=-1)


def _flat(rows: int) -> torch.Tensor:
    return torch.full((rows, V), 1.0 / V, dtype=torch.float32)


def make_pair(name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(target table, draft table), each [V + 1, V]."""
    gen = torch.Generator().manual_seed(1234)
    rows = V + 1
    if name == "random":
        return _dirichlet(gen, rows), _dirichlet(gen, rows)
    if name == "equal":
        table = _dirichlet(gen, rows)
        return table, table.clone()
    if name == "disjoint":  # target on even tokens, draft on odd: every draft is rejected
        return _dirichlet(gen, rows, slice(0, V, 2)), _dirichlet(gen, rows, slice(1, V, 2))
    if name == "overlap":  # target on 0..7, draft on 4..11
        return _dirichlet(gen, rows, slice(0, 8)), _dirichlet(gen, rows, slice(4, V))
    if name == "peaked_target_flat_draft":
        return _peaked(gen, rows), _flat(rows)
    if name == "flat_target_peaked_draft":
        return _flat(rows), _peaked(gen, rows)
    raise ValueError(name)


PAIRS = [
    "random",
    "equal",
    "disjoint",
    "overlap",
    "peaked_target_flat_draft",
    "flat_target_peaked_draft",
]


def simulate(target, draft_table, k, num_rows, seed, deterministic_draft=False, num_tokens=2):
    """Speculative generation of num_tokens tokens per row; returns [num_rows, num_tokens].

    target, draft_table: [V + 1, V]; state V means "no token yet". The draft samples each of
    its k tokens from its own distribution (or takes its argmax, with p_draft=None: the
    n-gram case). Verification randomness comes from one generator, drafting from another.
    """
    verify_gen = torch.Generator().manual_seed(seed)
    draft_gen = torch.Generator().manual_seed(seed + 1)
    out = torch.full((num_rows, num_tokens), -1, dtype=torch.long)
    count = torch.zeros(num_rows, dtype=torch.long)
    state = torch.full((num_rows,), V, dtype=torch.long)
    while (count < num_tokens).any():
        rows = torch.nonzero(count < num_tokens).squeeze(1)
        # draft k tokens one after another, each conditioned on the previous one
        contexts = [state[rows]]  # contexts[i]: the token before position i, [b]
        drafted = []
        for _ in range(k):
            p = draft_table[contexts[-1]]  # [b, V]
            if deterministic_draft:
                token = p.argmax(dim=1)
            else:  # inverse-CDF sampling: multinomial's job, faster for many short rows
                cdf = p.cumsum(dim=1)
                cdf = cdf / cdf[:, -1:]  # the last entry exactly 1: never past the last token
                u = torch.rand(len(rows), 1, generator=draft_gen, dtype=p.dtype)
                token = (cdf <= u).sum(dim=1)
            drafted.append(token)
            contexts.append(token)
        draft = torch.stack(drafted, dim=1) if k else torch.zeros(len(rows), 0, dtype=torch.long)
        context = torch.stack(contexts, dim=1)  # [b, k + 1]
        p_target = target[context]  # [b, k + 1, V]: the target's pass over [last, *draft]
        p_draft = None if deterministic_draft else draft_table[context[:, :k]]  # [b, k, V]
        num_accepted, next_token, _, _ = rejection_sample_batch(
            draft, p_target, p_draft, verify_gen
        )
        # emitted: the accepted prefix of the draft, then next_token
        emitted = torch.cat([draft, next_token.unsqueeze(1)], dim=1)  # [b, k + 1]
        emitted.scatter_(1, num_accepted.unsqueeze(1), next_token.unsqueeze(1))
        for j in range(k + 1):
            pos = count[rows] + j
            write = (j <= num_accepted) & (pos < num_tokens)
            out[rows[write], pos[write]] = emitted[write, j]
        count[rows] += num_accepted + 1
        state[rows] = next_token
    return out


def chi2_pvalue(observed: np.ndarray, expected_probs: np.ndarray) -> float:
    """Chi-square goodness of fit; cells expected below 5 are pooled into one; a draw in a
    cell of probability 0 is an outright failure."""
    observed = np.asarray(observed, dtype=np.float64).ravel()
    expected = np.asarray(expected_probs, dtype=np.float64).ravel()
    expected = expected / expected.sum() * observed.sum()
    if observed[expected == 0].sum() > 0:
        return 0.0
    small = expected < 5
    obs, exp = list(observed[~small]), list(expected[~small])
    if expected[small].sum() > 0:
        obs.append(observed[small].sum())
        exp.append(expected[small].sum())
    return float(chisquare(obs, exp).pvalue)


def first_two_pvalues(target, out) -> tuple[float, float]:
    """p-values of the first token vs p_target and of (first, second) vs the two-step joint."""
    first = np.bincount(out[:, 0].numpy(), minlength=V)
    p_first = target[V].numpy()  # [V]
    pairs = np.bincount((out[:, 0] * V + out[:, 1]).numpy(), minlength=V * V)
    p_pairs = p_first[:, None] * target[:V].numpy()  # [V, V]: p(a) * p(b | a)
    return chi2_pvalue(first, p_first), chi2_pvalue(pairs, p_pairs)


# ---------------------------------------------------------------------------------------------
# Losslessness


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("pair", PAIRS)
def test_rejection_sampling_is_lossless(pair, k):
    target, draft = make_pair(pair)
    out = simulate(target, draft, k, NUM_ROWS, seed=k)
    p_first, p_joint = first_two_pvalues(target, out)
    assert p_first > P_MIN, f"first token differs from p_target: p={p_first:.2e}"
    assert p_joint > P_MIN, f"first two tokens differ from the target's joint: p={p_joint:.2e}"


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("pair", ["random", "peaked_target_flat_draft"])
def test_deterministic_draft_is_lossless(pair, k):
    """The n-gram case: a proposer without a distribution (p_draft=None, a one-hot)."""
    target, draft = make_pair(pair)
    out = simulate(target, draft, k, NUM_ROWS, seed=10 + k, deterministic_draft=True)
    p_first, p_joint = first_two_pvalues(target, out)
    assert p_first > P_MIN and p_joint > P_MIN, (p_first, p_joint)


def test_acceptance_rate_matches_the_overlap():
    """P(accept the first draft token) = sum_x min(p_target(x), p_draft(x)) (Leviathan Thm 3.5)."""
    target, draft = make_pair("random")
    gen = torch.Generator().manual_seed(7)
    rows = 100_000
    p_target = target[V].expand(rows, 2, V)  # [rows, 2, V]
    p_draft = draft[V].expand(rows, 1, V)  # [rows, 1, V]
    tokens = torch.multinomial(draft[V], rows, replacement=True, generator=gen).unsqueeze(1)
    num_accepted, _, _, _ = rejection_sample_batch(tokens, p_target, p_draft, gen)
    alpha = torch.minimum(target[V], draft[V]).sum().item()
    rate = num_accepted.double().mean().item()
    assert abs(rate - alpha) < 4 * (alpha * (1 - alpha) / rows) ** 0.5, (rate, alpha)


# The same harness with one piece of the rule replaced: a plausible mistake must be caught.


def _always_accept(p_target_x, p_draft_x):
    return torch.ones_like(p_target_x)


def _resample_from_target(p_target, p_draft):
    return p_target


@pytest.mark.parametrize(
    "piece, wrong_rule",
    [
        ("accept_probability", _always_accept),  # i.e. sample from the draft
        ("residual_distribution", _resample_from_target),  # forgets to subtract p_draft
    ],
)
@pytest.mark.parametrize("pair", ["random", "peaked_target_flat_draft"])
def test_a_wrong_rule_fails_the_same_test(monkeypatch, piece, wrong_rule, pair):
    monkeypatch.setattr(rejection, piece, wrong_rule)
    target, draft = make_pair(pair)
    out = simulate(target, draft, 2, NUM_ROWS, seed=2)
    p_first, p_joint = first_two_pvalues(target, out)
    assert p_first < 1e-9 and p_joint < 1e-9, (p_first, p_joint)


def test_single_request_path_is_lossless_too():
    """rejection_sample (one request, its own generator) on a few thousand calls."""
    target, draft = make_pair("random")
    gen = torch.Generator().manual_seed(3)
    k, calls = 2, 3000
    first = np.zeros(V, dtype=np.int64)
    for _ in range(calls):
        tokens, ctx = [], V
        for _ in range(k):
            ctx = int(torch.multinomial(draft[ctx], 1, generator=gen))
            tokens.append(ctx)
        contexts = [V] + tokens
        decision = rejection_sample(tokens, target[contexts], draft[contexts[:k]], gen)
        first[decision.emitted_tokens[0]] += 1
    assert chi2_pvalue(first, target[V].numpy()) > P_MIN


# ---------------------------------------------------------------------------------------------
# rejection_sample: the records the app draws


def _probs(rows: list[list[float]]) -> torch.Tensor:
    return _normalize(torch.tensor(rows, dtype=torch.float32))


def test_same_seed_same_decision_and_matches_the_batch_core():
    target, draft = make_pair("random")
    contexts = [V, 3, 5, 7]
    p_target, p_draft = target[contexts], draft[contexts[:3]]
    decisions = [
        rejection_sample([3, 5, 7], p_target, p_draft, torch.Generator().manual_seed(s))
        for s in (0, 0, 1)
    ]
    assert decisions[0] == decisions[1]
    core = rejection_sample_batch(
        torch.tensor([[3, 5, 7]]), p_target[None], p_draft[None], torch.Generator().manual_seed(0)
    )
    assert decisions[0].num_accepted == int(core[0][0])
    assert decisions[0].next_token_id == int(core[1][0])


def test_equal_distributions_accept_everything_and_take_a_bonus():
    p = _probs([[1, 2, 3, 4], [4, 3, 2, 1], [1, 1, 1, 1]])
    decision = rejection_sample([2, 0], p, p[:2], torch.Generator().manual_seed(0))
    assert decision.num_accepted == 2 and decision.next_kind == "bonus"
    assert [d.accept_prob for d in decision.drafted] == [1.0, 1.0]
    assert all(d.accepted and d.checked for d in decision.drafted)
    assert decision.drafted[0].p_target == pytest.approx(0.3)
    assert decision.emitted_tokens == [2, 0, decision.next_token_id]


def test_disjoint_support_rejects_first_and_corrects_from_the_target():
    p_target = _probs([[1, 0, 1, 0], [1, 0, 1, 0], [1, 0, 1, 0]])
    p_draft = _probs([[0, 1, 0, 1], [0, 1, 0, 1]])
    for seed in range(20):
        decision = rejection_sample([1, 3], p_target, p_draft, torch.Generator().manual_seed(seed))
        assert decision.num_accepted == 0 and decision.next_kind == "correction"
        assert decision.next_token_id in (0, 2)
        first, second = decision.drafted
        assert first.checked and first.accept_prob == 0.0 and not first.accepted
        assert first.p_target == 0.0 and first.p_draft == pytest.approx(0.5)
        assert not second.checked and not second.accepted  # discarded after the rejection
    json.dumps(decision.to_dict())


def test_one_hot_draft_accepts_with_the_target_probability():
    p_target = _probs([[1, 3, 0, 0], [1, 1, 1, 1]])
    decision = rejection_sample([1], p_target, None, torch.Generator().manual_seed(0))
    assert decision.drafted[0].accept_prob == pytest.approx(0.75)
    assert decision.drafted[0].p_draft == 1.0
    if decision.num_accepted == 0:
        assert decision.next_token_id == 0  # the residual removes the rejected token


def test_no_draft_is_a_plain_sample():
    p_target = _probs([[0, 0, 1, 0]])
    decision = rejection_sample([], p_target, torch.zeros(0, 4), torch.Generator())
    assert decision == SpecDecision(drafted=[], num_accepted=0, next_token_id=2, next_kind="bonus")


def test_residual_falls_back_to_the_target_when_empty():
    p = _probs([[1, 2, 3, 4]])
    assert torch.allclose(rejection.residual_distribution(p, p), p)
    q = _probs([[0, 2, 3, 4]])
    assert torch.allclose(rejection.residual_distribution(p, q), torch.tensor([[1.0, 0, 0, 0]]))


# ---------------------------------------------------------------------------------------------
# Greedy


@pytest.mark.parametrize(
    "draft, target_argmax, expected",
    [
        ([5, 6, 7], [5, 6, 7, 8], (3, 8)),  # all accepted, 8 is the bonus
        ([5, 6, 7], [5, 9, 7, 8], (1, 9)),  # 6 rejected, 9 is the correction
        ([5, 6, 7], [4, 6, 7, 8], (0, 4)),  # later matches do not count after a mismatch
        ([], [3], (0, 3)),
    ],
)
def test_verify_greedy(draft, target_argmax, expected):
    assert verify_greedy(draft, target_argmax) == expected


def test_greedy_decision_records():
    p_target = _probs([[1, 5, 1], [5, 1, 1], [1, 1, 5]])
    p_draft = _probs([[1, 5, 1], [1, 5, 1]])
    decision = greedy_decision([1, 1], p_target.argmax(dim=1), p_target, p_draft)
    assert (decision.num_accepted, decision.next_token_id, decision.next_kind) == (1, 0, "correction")
    assert [d.accept_prob for d in decision.drafted] == [1.0, 0.0]
    assert [d.accepted for d in decision.drafted] == [True, False]
    assert decision.drafted[1].p_target == pytest.approx(1 / 7)
    assert decision.drafted[1].p_draft == pytest.approx(5 / 7)
    bare = greedy_decision([2, 2, 2], [2, 2, 2, 1])
    assert bare.next_kind == "bonus" and bare.drafted[0].p_target is None
    assert greedy_decision([0, 2, 2], [1, 2, 2, 1]).drafted[2].checked is False


@settings(max_examples=200, deadline=None)
@given(
    draft=st.lists(st.integers(0, 2), max_size=6),
    data=st.data(),
)
def test_greedy_accepts_the_common_prefix(draft, data):
    argmax = data.draw(
        st.lists(st.integers(0, 2), min_size=len(draft) + 1, max_size=len(draft) + 1)
    )
    num_accepted, next_token = verify_greedy(draft, argmax)
    assert draft[:num_accepted] == argmax[:num_accepted]
    assert num_accepted == len(draft) or draft[num_accepted] != argmax[num_accepted]
    assert next_token == argmax[num_accepted]
    decision = greedy_decision(draft, argmax)
    assert decision.emitted_tokens == argmax[: num_accepted + 1]
