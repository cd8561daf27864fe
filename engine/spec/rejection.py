"""Verifying a draft: greedy matching and the lossless rejection sampler.

The proposer drafts k tokens x_1..x_k; the target runs once over [last, x_1, ..., x_k] and
gives k + 1 next-token distributions p_target[0..k] (row i is the target's distribution for
the token after x_i, with x_0 = last). Then, as in Leviathan, Kalman & Matias 2023, "Fast
Inference from Transformers via Speculative Decoding" (arXiv:2211.17192, Algorithm 1) and
Chen et al. 2023, "Accelerating Large Language Model Decoding with Speculative Sampling"
(arXiv:2302.01318):

    for i in 0 .. k-1:
        accept x_{i+1} with probability min(1, p_target[i, x] / p_draft[i, x])
        on the first rejection: emit a token from normalize(max(0, p_target[i] - p_draft[i]))
                                and stop (the "correction")
    all k accepted: emit a token from p_target[k] (the "bonus")

Every emitted token is then distributed exactly as if the target had sampled it alone:
speculation changes the speed, never the output distribution. Greedy decoding is the
temperature-0 case: accept while the draft equals the target's argmax.

Names: the paper calls the target p and the draft q; gpt-fast's comments swap them. Here
they are always `p_target` and `p_draft`. A proposer without a distribution (n-gram) is a
draft that puts all its mass on the token it proposed: pass `p_draft=None` for that
one-hot, and the accept probability becomes p_target[i, x].

`rejection_sample_batch` is the vectorised core (many rows, one generator); the engine
calls `rejection_sample` per request with that request's generator, so a seed fully
determines its tokens. Pass the distributions the sampler would sample from (after
temperature, top-k, top-p): losslessness is with respect to exactly those.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
from torch import Tensor

CORRECTION = "correction"  # the first drafted token was rejected; this replaces it
BONUS = "bonus"  # every drafted token was accepted; this one comes free from p_target[k]


@dataclass
class Alternative:
    """One of the target's most likely tokens at a position, from the row the verifier read."""

    token_id: int
    p: float  # its probability in that row
    text: str = ""  # the token decoded on its own (filled in by the engine)


@dataclass
class DraftToken:
    """What the verifier decided about one drafted token (the StepReport shows these)."""

    token_id: int  # the drafted token id
    p_target: float | None  # target's probability of this token at its position (None: unknown)
    p_draft: float | None  # draft's probability of it (1.0 for n-gram; None: unknown)
    accept_prob: float | None  # min(1, p_target / p_draft); greedy: 1 or 0; None: not checked
    accepted: bool  # kept in the output
    text: str = ""  # the token decoded on its own (filled in by the engine)
    # what the draft had to match: the target's most likely tokens at this position, most
    # likely first, from the same row as p_target; only for checked tokens (engine-filled)
    top: list[Alternative] = field(default_factory=list)

    @property
    def checked(self) -> bool:
        """False for tokens after the first rejection: they are discarded unexamined."""
        return self.accept_prob is not None


@dataclass
class SpecDecision:
    """One request's verification: a record per drafted token and the token emitted after."""

    drafted: list[DraftToken]  # one per drafted token, in order
    num_accepted: int  # length of the accepted prefix of the draft
    next_token_id: int  # emitted after the accepted prefix
    next_kind: str  # "correction" (a draft token was rejected) or "bonus" (all accepted)
    request_id: str = ""  # filled in by the engine, with the texts
    next_text: str = ""
    source: str = ""  # filled in by the engine: "lookup" (n-gram) or "model" drafted it
    # the target's row after the accepted prefix (row num_accepted): the next token's
    # probability there and its most likely tokens. A correction is drawn from the residual
    # max(0, p_target - p_draft), not from this row, so next_p may be small.
    next_p: float | None = None
    next_top: list[Alternative] = field(default_factory=list)

    @property
    def num_drafted(self) -> int:
        return len(self.drafted)

    @property
    def accepted_tokens(self) -> list[int]:
        return [d.token_id for d in self.drafted[: self.num_accepted]]

    @property
    def emitted_tokens(self) -> list[int]:
        """What the request gains this step: the accepted drafts, then next_token_id."""
        return self.accepted_tokens + [self.next_token_id]

    def to_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------------------------------------
# The rule, in three small pieces (the tests swap one piece for a wrong rule and see it fail)


def accept_probability(p_target_x: Tensor, p_draft_x: Tensor) -> Tensor:
    """min(1, p_target[x] / p_draft[x]) elementwise; a token the draft gave 0 is kept iff the
    target gives it > 0 (it cannot have been sampled from the draft, but do not divide by 0)."""
    ratio = p_target_x / torch.where(p_draft_x > 0, p_draft_x, torch.ones_like(p_draft_x))
    return torch.where(p_draft_x > 0, ratio.clamp(max=1.0), (p_target_x > 0).to(ratio.dtype))


def residual_distribution(p_target: Tensor, p_draft: Tensor) -> Tensor:
    """normalize(max(0, p_target - p_draft)) over the last dim; where that is all zero
    (p_draft covers p_target everywhere, so a rejection was a rounding accident), p_target."""
    residual = (p_target - p_draft).clamp(min=0)  # [..., V]
    mass = residual.sum(dim=-1, keepdim=True)  # [..., 1]
    fallback = mass <= 0
    residual = torch.where(fallback, p_target, residual)
    return residual / residual.sum(dim=-1, keepdim=True)


def sample_from(probs: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """One token per row of probs [B, V] (rows need not sum to 1), by inverting the CDF with
    one uniform draw per row. A token of probability 0 is never drawn. (torch.multinomial
    does the same job but draws V exponentials per row: ~50x slower at V = 49152 on a CPU.)"""
    cdf = probs.double().cumsum(dim=-1)  # [B, V]; float64: 49k terms summed with no visible drift
    cdf = cdf / cdf[:, -1:]  # the last entry is now exactly 1.0, so u < 1 stays inside
    u = torch.rand(probs.shape[0], 1, generator=generator, device=probs.device, dtype=cdf.dtype)
    return torch.searchsorted(cdf, u, right=True).squeeze(1)  # [B]: first i with cdf[i] > u


def _as_probs(p: Tensor) -> Tensor:
    return p if p.dtype in (torch.float32, torch.float64) else p.float()


def rejection_sample_batch(
    draft: Tensor,
    p_target: Tensor,
    p_draft: Tensor | None,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The vectorised core: B independent rows verified at once with one generator.

    draft:    [B, k] drafted token ids (int64); k may be 0
    p_target: [B, k + 1, V] target distributions after [last, *draft]
    p_draft:  [B, k, V] draft distributions the draft tokens were sampled from, or None
              for a deterministic proposer (a one-hot on each drafted token)
    Returns (num_accepted [B], next_token [B], accept_prob [B, k], accepted [B, k]);
    accepted[b, i] is True only inside the accepted prefix.
    Random draws, in order: torch.rand [B, k] for the accept tests, then torch.rand [B, 1]
    for the next token (`sample_from`).
    """
    p_target = _as_probs(p_target)
    num_rows, k = draft.shape
    assert p_target.shape[:2] == (num_rows, k + 1), (p_target.shape, draft.shape)
    if p_draft is None:
        p_draft = torch.zeros_like(p_target[:, :k])  # [B, k, V]
        p_draft.scatter_(2, draft.unsqueeze(2), 1.0)
    p_draft = _as_probs(p_draft).to(p_target.dtype)
    assert p_draft.shape == (num_rows, k, p_target.shape[2]), (p_draft.shape, p_target.shape)
    device = p_target.device

    # 1. Accept each drafted token x with probability min(1, p_target[x] / p_draft[x]).
    index = draft.unsqueeze(2)  # [B, k, 1]
    p_target_x = p_target[:, :k].gather(2, index).squeeze(2)  # [B, k]
    p_draft_x = p_draft.gather(2, index).squeeze(2)  # [B, k]
    accept_prob = accept_probability(p_target_x, p_draft_x)  # [B, k]
    u = torch.rand(num_rows, k, generator=generator, device=device, dtype=p_target.dtype)
    passed = u < accept_prob  # [B, k]
    # Only the prefix before the first failure counts: later tokens were drafted after a
    # token the target rejected, so they are discarded whatever their own draw said.
    accepted = passed.long().cumprod(dim=1).bool()  # [B, k]
    num_accepted = accepted.sum(dim=1)  # [B]

    # 2. The next token: from the residual at the first rejection, or the bonus p_target[k].
    rows = torch.arange(num_rows, device=device)
    p_target_next = p_target[rows, num_accepted]  # [B, V] (row k is the bonus distribution)
    rejected = num_accepted < k  # [B]
    next_dist = p_target_next
    if k > 0:
        p_draft_next = p_draft[rows, num_accepted.clamp(max=k - 1)]  # [B, V]
        correction = residual_distribution(p_target_next, p_draft_next)  # [B, V]
        next_dist = torch.where(rejected.unsqueeze(1), correction, p_target_next)
    next_token = sample_from(next_dist, generator)  # [B]
    return num_accepted, next_token, accept_prob, accepted


def rejection_sample(
    draft: list[int],
    p_target: Tensor,
    p_draft: Tensor | None,
    generator: torch.Generator | None = None,
) -> SpecDecision:
    """Lossless verification of one request's draft (Leviathan et al. 2023, Algorithm 1).

    draft: k drafted token ids; p_target: [k + 1, V]; p_draft: [k, V] or None (one-hot,
    for a proposer without a distribution). Every random draw uses `generator`.
    """
    k = len(draft)
    draft_t = torch.tensor(draft, dtype=torch.long, device=p_target.device).view(1, k)  # [1, k]
    num_accepted_t, next_token_t, accept_prob_t, _ = rejection_sample_batch(
        draft_t, p_target.unsqueeze(0), None if p_draft is None else p_draft.unsqueeze(0), generator
    )
    num_accepted = int(num_accepted_t[0])
    accept_prob = accept_prob_t[0].tolist()
    p_target_x = _probs_of(p_target, draft)
    p_draft_x = [1.0] * k if p_draft is None else _probs_of(p_draft, draft)
    records = [
        DraftToken(
            token_id=draft[i],
            p_target=p_target_x[i],
            p_draft=p_draft_x[i],
            accept_prob=accept_prob[i] if i <= num_accepted else None,
            accepted=i < num_accepted,
        )
        for i in range(k)
    ]
    return SpecDecision(
        drafted=records,
        num_accepted=num_accepted,
        next_token_id=int(next_token_t[0]),
        next_kind=BONUS if num_accepted == k else CORRECTION,
    )


def top_of(p: Tensor, n: int) -> list[list[tuple[int, float]]]:
    """The n most likely (token id, probability) of each row of p [rows, V], most likely
    first; one topk on the rows and one copy back."""
    if p.shape[0] == 0 or n <= 0:
        return [[] for _ in range(p.shape[0])]
    vals, ids = p.float().topk(min(n, p.shape[-1]), dim=-1)
    return [list(zip(i, v)) for i, v in zip(ids.tolist(), vals.tolist())]


def _probs_of(p: Tensor, tokens: list[int]) -> list[float]:
    """p[i, tokens[i]] for each i, as floats."""
    if not tokens:
        return []
    index = torch.tensor(tokens, dtype=torch.long, device=p.device)
    return p[torch.arange(len(tokens), device=p.device), index].float().tolist()


# ---------------------------------------------------------------------------------------------
# Greedy (temperature 0): the target's argmax is the only token it would ever emit


def verify_greedy(draft: list[int], target_argmax: list[int]) -> tuple[int, int]:
    """Accept while draft[i] == target_argmax[i]; then the target's own token.

    target_argmax: len(draft) + 1 entries, the target's argmax after [last, *draft].
    Returns (num_accepted, next_token): next_token is target_argmax[num_accepted], the
    correction at the first mismatch or the bonus when the whole draft matched.
    """
    assert len(target_argmax) == len(draft) + 1, (len(draft), len(target_argmax))
    num_accepted = 0
    while num_accepted < len(draft) and draft[num_accepted] == target_argmax[num_accepted]:
        num_accepted += 1
    return num_accepted, int(target_argmax[num_accepted])


def greedy_decision(
    draft: list[int],
    target_argmax: list[int] | Tensor,
    p_target: Tensor | None = None,
    p_draft: Tensor | None = None,
) -> SpecDecision:
    """verify_greedy as a SpecDecision, with probabilities filled in when given.

    p_target: [k + 1, V] and p_draft: [k, V], optional, only for the records (the decision
    uses the argmax alone); accept_prob is 1.0 or 0.0 for checked tokens.
    """
    if isinstance(target_argmax, Tensor):
        target_argmax = target_argmax.tolist()
    k = len(draft)
    num_accepted, next_token = verify_greedy(draft, target_argmax)
    p_target_x = [None] * k if p_target is None else _probs_of(p_target, draft)
    p_draft_x = [None] * k if p_draft is None else _probs_of(p_draft, draft)
    records = [
        DraftToken(
            token_id=draft[i],
            p_target=p_target_x[i],
            p_draft=p_draft_x[i],
            accept_prob=(1.0 if i < num_accepted else 0.0) if i <= num_accepted else None,
            accepted=i < num_accepted,
        )
        for i in range(k)
    ]
    return SpecDecision(
        drafted=records,
        num_accepted=num_accepted,
        next_token_id=next_token,
        next_kind=BONUS if num_accepted == k else CORRECTION,
    )
