"""Why a request did not advance this step: one stable code per request and a few fields,
decided where the scheduler decides (engine/scheduler.py), not reconstructed afterwards.

A program counts the codes (the step stream sends them, `/metrics` tallies the waiting ones,
a trace names its slices by them); the app and the phones say them in zh and en
(app/i18n.py, keys `wait.<code>`). Each code and its fields:

    seats_full     every seat is taken (max_num_seqs): seats, taken
    token_budget   this step's token budget (max_num_batched_tokens) was spent before this
                   request's turn: budget
    kv_short       too few free KV blocks: needed, free
    kv_fragmented  contiguous KV: enough blocks free in all, but no free run as long as the
                   request's reservation: needed, free, largest_free_run
    bus_running    static batching: the bus boards again only when every rider is done:
                   riders_left
    queued_behind  an earlier arrival waits at the head of the queue: position (1 = next
                   after the head), behind (the head's id), head_code (the head's own code)
    preempted      its blocks were taken back this step so a running request could go on,
                   and it recomputes from the queue: rule ("recompute": the latest admitted
                   goes), redo_tokens (what it had computed), for_request
    prefill_chunk  a running prompt computed only a chunk (chunked prefill shares the
                   budget): computed, remaining (what is left after this step)

Every waiting request gets exactly one code each step. A running request gets one only when
the step skipped it (token_budget) or cut its prompt short (prefill_chunk).
"""

from __future__ import annotations

from dataclasses import dataclass, field

WAIT_CODES = ("seats_full", "token_budget", "kv_short", "kv_fragmented", "bus_running",
              "queued_behind", "preempted", "prefill_chunk")


@dataclass(frozen=True)
class Wait:
    code: str
    fields: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.code not in WAIT_CODES:
            raise ValueError(f"unknown wait code {self.code!r}; one of {WAIT_CODES}")

    def to_dict(self) -> dict:
        return {"code": self.code, **self.fields}


def count_codes(waits: dict[str, dict], ids=None) -> dict[str, int]:
    """How many of `waits` (request id -> {"code", ...}, as a report holds them) have each
    code; only those of `ids` when given."""
    counts: dict[str, int] = {}
    for rid, w in waits.items():
        if ids is None or rid in ids:
            counts[w["code"]] = counts.get(w["code"], 0) + 1
    return counts


def waiting_by_reason(waits: dict[str, dict], waiting: list[str]) -> dict[str, int]:
    """The waiting requests counted by their code (every code present, zeros included): the
    counts add up to len(waiting)."""
    return {**dict.fromkeys(WAIT_CODES, 0), **count_codes(waits, set(waiting))}
