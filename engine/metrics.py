"""Serving metrics: latency per request, throughput over a window, KV use and seat use.

TTFT (time to first token) = first token time - arrival; TPOT (time per output token) =
(finish - first token) / (output tokens - 1). Throughput is output tokens per second over
the last `window` steps. KV figures follow the PagedAttention paper's accounting: useful
fraction = slots holding real tokens / slots allocated or reserved.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engine.request import Request


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    v = sorted(values)
    k = (len(v) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def num_examined(num_drafted: int, num_accepted: int) -> int:
    """Drafted tokens one verification decided on: the accepted ones and the first rejected
    one, if any (the tokens after a rejection are thrown away unexamined). The lesson's a,
    the chance a drafted token is accepted given the ones before it were, is then
    sum(accepted) / sum(examined); the bench (RunMetrics) and the page (spec_summary) both
    count it here."""
    return min(num_drafted, num_accepted + 1)


def ttft(req: Request) -> float | None:
    return None if req.first_token_time is None else req.first_token_time - req.arrival_time


def tpot(req: Request) -> float | None:
    if req.finish_time is None or req.first_token_time is None or req.num_output_tokens < 2:
        return None
    return (req.finish_time - req.first_token_time) / (req.num_output_tokens - 1)


@dataclass
class RunMetrics:
    """Accumulated over every step of a run; `snapshot()` is what the gauges show."""

    window: int = 20
    steps: int = 0
    output_tokens: int = 0
    busy_seat_steps: int = 0  # seats computing a live request, summed over steps
    idle_seat_steps: int = 0  # static batching: seats held by finished riders
    seat_steps: int = 0  # seats occupied (busy + idle)
    concurrency_sum: int = 0
    peak_concurrency: int = 0
    useful_slots_sum: int = 0
    held_slots_sum: int = 0
    drafted: int = 0
    accepted: int = 0
    examined: int = 0  # drafted tokens the verifier decided on: the accepted + a first rejection
    accepted_by_pos: list[int] = field(default_factory=list)
    drafted_by_pos: list[int] = field(default_factory=list)
    verify_steps: int = 0  # request-steps that verified a draft
    steps_by_k: dict = field(default_factory=dict)  # speculating: decode steps run at each k
    recent: deque = field(default_factory=deque)  # (wall time end, tokens) of recent steps
    ttfts: list[float] = field(default_factory=list)
    tpots: list[float] = field(default_factory=list)

    def on_step(self, t_end: float, dt: float, tokens: int, busy: int, idle: int,
                useful_slots: int, held_slots: int) -> None:
        self.steps += 1
        self.output_tokens += tokens
        self.busy_seat_steps += busy
        self.idle_seat_steps += idle
        self.seat_steps += busy + idle
        self.concurrency_sum += busy
        self.peak_concurrency = max(self.peak_concurrency, busy)
        self.useful_slots_sum += useful_slots
        self.held_slots_sum += held_slots
        self.recent.append((t_end, dt, tokens))
        while len(self.recent) > self.window:
            self.recent.popleft()

    def on_finish(self, req: Request) -> None:
        if (t := ttft(req)) is not None:
            self.ttfts.append(t)
        if (t := tpot(req)) is not None:
            self.tpots.append(t)

    def on_spec_k(self, k: int) -> None:
        """A step with requests decoding drafted with this k (adaptive k varies it)."""
        self.steps_by_k[k] = self.steps_by_k.get(k, 0) + 1

    def on_verify(self, num_drafted: int, num_accepted: int) -> None:
        self.verify_steps += 1
        self.drafted += num_drafted
        self.accepted += num_accepted
        self.examined += num_examined(num_drafted, num_accepted)
        for i in range(num_drafted):
            if i >= len(self.drafted_by_pos):
                self.drafted_by_pos.append(0)
                self.accepted_by_pos.append(0)
            self.drafted_by_pos[i] += 1
            self.accepted_by_pos[i] += int(i < num_accepted)

    @property
    def tokens_per_s(self) -> float:
        busy = sum(dt for _, dt, _ in self.recent)
        return sum(n for _, _, n in self.recent) / busy if busy > 0 else 0.0

    def snapshot(self, scheduler=None, seats_total: int | None = None) -> dict:
        """The run's figures; with the engine's `scheduler`, also its state now: seats busy
        (of `seats_total`), the share of KV blocks in use, the prefix hit rate, the queue."""
        snap = {
            "tokens_per_s": self.tokens_per_s,
            "output_tokens": self.output_tokens,
            "ttft_p50_s": percentile(self.ttfts, 0.5),
            "ttft_p99_s": percentile(self.ttfts, 0.99),
            "tpot_p50_s": percentile(self.tpots, 0.5),
            "mean_concurrency": self.concurrency_sum / self.steps if self.steps else 0.0,
            "peak_concurrency": self.peak_concurrency,
            "idle_seat_frac": self.idle_seat_steps / self.seat_steps if self.seat_steps else 0.0,
            "kv_useful_frac": (self.useful_slots_sum / self.held_slots_sum
                               if self.held_slots_sum else 1.0),
            "acceptance_rate": self.accepted / self.drafted if self.drafted else None,
            "mean_accepted_len": self.accepted / self.verify_steps if self.verify_steps else None,
            # the lesson's a: the chance a drafted token is accepted given the ones before it
            # were (tokens after a rejection are never examined)
            "a": self.accepted / self.examined if self.examined else None,
            "acceptance_by_position": [a / d if d else 0.0 for a, d in
                                       zip(self.accepted_by_pos, self.drafted_by_pos)],
            "k_share": _shares(self.steps_by_k),
        }
        if scheduler is not None:
            kv = scheduler.allocator
            snap.update(seats_busy=sum(1 for r in scheduler.running if not r.idle_finished),
                        seats_total=seats_total,
                        kv_used_frac=1 - kv.num_free_blocks / kv.num_blocks,
                        prefix_hit_rate=getattr(kv, "prefix_hit_rate", None),
                        waiting=len(scheduler.waiting))
        return snap


def _shares(counts: dict) -> dict | None:
    """{k: count} -> {k: share of the total}, keys in order; None when empty."""
    total = sum(counts.values())
    return {k: counts[k] / total for k in sorted(counts)} if total else None
