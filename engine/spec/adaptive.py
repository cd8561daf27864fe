"""SpecLength: how many tokens to draft this step, chosen from what the engine has measured.

A draft of k tokens pays only when the verification pass over k + 1 tokens per request costs
little more than a pass over one, and when enough of the draft is accepted. Both change as the
server runs: a batch of 1 on a GPU verifies 5 tokens for the price of one, a batch of 32 on a
CPU pays for every row; grounded text accepts more than open chat. So the engine measures and
chooses, every step, the k that gives the most tokens per second ("goodput"), as SmartSpec
does (Liu et al. 2024, "Optimizing Speculative Decoding for Serving Large Language Models Using
Goodput", arXiv:2406.14066; k = 0 turns speculation off for the step).

With B requests decoding, asking each for k drafted tokens:

    E(k)    = 1 + sum_{i<k} c_i       tokens each request emits; c_i = the share of requests
                                      asked for at least i + 1 drafts whose first i + 1 drafts
                                      were all accepted (so a proposer that found nothing to
                                      draft, or stopped early, counts as a miss)
    L(k)    = sum_{i<k} q_i           drafted tokens per request; q_i = the share that drafted
                                      at least i + 1
    n(k)    = B (1 + L(k)) + idle     tokens in the target's forward (idle: static batching's
                                      finished riders, computed and thrown away)
    cost(k) = T(n(k)) + k d(B)        T(n): measured time of a decode step of n tokens (after
                                      drafting: scheduling, the forward, verifying, the report);
                                      d(B): measured drafting time per drafted position
    k*      = argmax_k  B E(k) / cost(k)

Counts decay by `DECAY` every step that verified a draft, so the estimates follow the workload. T is kept per token
count (an average that moves by `RATE` towards each new measurement) and interpolated between
the counts seen; beyond the largest it is extended along the line through the smallest and
largest seen (never downhill), below the smallest held flat. Until something is measured every
k looks alike but for its accepted tokens, so the first steps draft all k. To measure the
others, every `EXPLORE_EVERY`-th step drafts the next k of a rotation over 0..k_max instead of
k* (a 1-in-8 detour, like SmartSpec's profiling, but online).

The choice is lossless whatever it is (greedy output is the same token for token; sampled
output follows the target's distribution), but it depends on timing: a seeded sampling request
under adaptive k draws differently from one run to the next. Greedy requests do not.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass


@dataclass
class Estimate:
    """What SpecLength expects from one k (for the StepReport and the speculation page)."""

    k: int
    tokens_per_request: float  # E(k)
    step_ms: float | None  # cost(k); None before anything was measured
    tokens_per_s: float | None  # B E(k) / cost(k)


class SpecLength:
    DECAY = 0.98  # per step: counts from ~50 steps ago weigh a third
    RATE = 0.25  # how far a step-time average moves towards each new measurement
    EXPLORE_EVERY = 8
    PRIOR_ACCEPT = 0.6  # before any verification: each drafted token accepted with this
    PRIOR_WEIGHT = 2.0  # ... weighing as much as this many requests

    def __init__(self, k_max: int):
        if k_max < 1:
            raise ValueError(f"k_max must be at least 1, got {k_max}")
        self.k_max = k_max
        w = self.PRIOR_WEIGHT
        self.asked = [w] * k_max  # requests asked for at least i + 1 drafts
        self.proposed = [w] * k_max  # ... that drafted at least i + 1
        self.accepted = [w * self.PRIOR_ACCEPT ** (i + 1) for i in range(k_max)]
        self.step_s: dict[int, float] = {}  # tokens in a decode step -> seconds
        self.draft_s: dict[int, float] = {}  # requests drafting -> seconds per position
        self.num_choices = 0
        self._rotation = 0
        self.last: list[Estimate] = []  # the estimates behind the latest choice
        self.explored = False  # was the latest choice a detour?
        self._verified = False  # a request was observed since the last step (then decay)

    # --- what happened ----------------------------------------------------------------------
    def observe_request(self, asked: int, proposed: int, accepted: int) -> None:
        """One request was asked for `asked` drafts, drafted `proposed`, `accepted` of them
        passed verification."""
        for i in range(min(asked, self.k_max)):
            self.asked[i] += 1
            self.proposed[i] += i < proposed
            self.accepted[i] += i < accepted
        self._verified = True

    def observe_step(self, num_tokens: int, seconds: float, num_drafting: int = 0,
                     drafted_positions: int = 0, draft_seconds: float = 0.0) -> None:
        """A decode step of `num_tokens` target tokens took `seconds` after drafting;
        `num_drafting` requests drafted up to `drafted_positions` tokens in `draft_seconds`."""
        if self._verified:  # steps that drafted nothing teach nothing about acceptance
            for counts in (self.asked, self.proposed, self.accepted):
                for i in range(len(counts)):
                    counts[i] *= self.DECAY
            self._verified = False
        _move(self.step_s, num_tokens, seconds, self.RATE)
        if num_drafting > 0 and drafted_positions > 0:
            _move(self.draft_s, num_drafting, draft_seconds / drafted_positions, self.RATE)

    # --- the model --------------------------------------------------------------------------
    def accept_share(self, i: int) -> float:
        """c_i: of the requests asked for at least i + 1 drafts, the share whose first i + 1
        were accepted (never more than c_{i-1})."""
        c = 1.0
        for j in range(i + 1):
            c = min(c, self.accepted[j] / self.asked[j])
        return c

    def tokens_per_request(self, k: int) -> float:
        return 1.0 + sum(self.accept_share(i) for i in range(k))

    def drafted_per_request(self, k: int) -> float:
        return sum(min(1.0, self.proposed[i] / self.asked[i]) for i in range(k))

    def step_seconds(self, num_tokens: float) -> float | None:
        """T(n), from the measured steps (None before the first)."""
        pts = sorted(self.step_s.items())
        if not pts:
            return None
        keys = [n for n, _ in pts]
        if num_tokens <= keys[0]:
            return pts[0][1]
        (n0, t0), (n1, t1) = pts[0], pts[-1]
        if num_tokens >= n1:
            slope = max(0.0, (t1 - t0) / (n1 - n0)) if n1 > n0 else 0.0
            return t1 + slope * (num_tokens - n1)
        j = bisect.bisect_left(keys, num_tokens)
        (na, ta), (nb, tb) = pts[j - 1], pts[j]
        return ta + (tb - ta) * (num_tokens - na) / (nb - na)

    def draft_seconds(self, num_drafting: int) -> float:
        """d(B): drafting time per position for this many requests (the nearest B measured)."""
        if not self.draft_s:
            return 0.0
        nearest = min(self.draft_s, key=lambda b: (abs(b - num_drafting), b))
        return self.draft_s[nearest]

    def estimates(self, num_decoding: int, num_idle: int = 0) -> list[Estimate]:
        out = []
        for k in range(self.k_max + 1):
            e = self.tokens_per_request(k)
            n = num_decoding * (1 + self.drafted_per_request(k)) + num_idle
            t = self.step_seconds(n)
            if t is None:
                out.append(Estimate(k, e, None, None))
                continue
            cost = t + k * self.draft_seconds(num_decoding)
            out.append(Estimate(k, e, cost * 1e3, num_decoding * e / cost if cost > 0 else None))
        return out

    # --- the choice -------------------------------------------------------------------------
    def choose(self, num_decoding: int, num_idle: int = 0) -> int:
        """k for this step's `num_decoding` requests (0: no drafting this step)."""
        self.explored = False
        if num_decoding <= 0:
            self.last = []
            return 0
        self.last = est = self.estimates(num_decoding, num_idle)
        if all(e.tokens_per_s is None for e in est):  # nothing measured yet: cost alike
            best = max(est, key=lambda e: (e.tokens_per_request, -e.k)).k
        else:
            best = max(est, key=lambda e: (e.tokens_per_s or 0.0, -e.k)).k
        self.num_choices += 1
        if self.num_choices % self.EXPLORE_EVERY == 0:
            k = self._rotation % (self.k_max + 1)
            self._rotation += 1
            if k == best:
                k = self._rotation % (self.k_max + 1)
                self._rotation += 1
            self.explored = True
            return k
        return best


def _move(avg: dict[int, float], key: int, value: float, rate: float) -> None:
    """avg[key] moves `rate` of the way towards value (set to it the first time)."""
    old = avg.get(key)
    avg[key] = value if old is None else old + rate * (value - old)
