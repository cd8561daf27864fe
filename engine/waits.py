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

`Timeline`: one request's own life as stretches (queued, prefill, decode, preempted), each
with its steps, its ms and the runs of codes it had; the server's loop builds one for each
student's request (a journey ticket), the phone draws it after the answer and the projector
when the teacher clicks the student's nickname. The class's own limits on a phone (one
question in flight, the pause after an answer) are not the engine's: their codes live with
the class server (classroom/server.py `OWN_WAIT_CODES`), which this package never imports.
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


# --- one request's own life, stretch by stretch --------------------------------------------

PHASES = ("queued", "prefill", "decode", "preempted")
MAX_STRETCHES = 48  # phase changes kept; past this the last stretch goes on (`truncated`)
MAX_REASONS = 16  # reason runs kept per stretch; past this a run adds to its code's first
PRIVATE_FIELDS = ("behind", "for_request")  # other requests' ids: never in a request's own view


class Timeline:
    """One request's own life as back-to-back stretches of one phase each, step by step:
    `queued` (at the door), `prefill` (its prompt computed, in chunks when chunked prefill
    shares the budget), `decode`, `preempted` (the step that took its blocks back). Each
    stretch: its phase, first and last step, how many steps, its start and end in ms since
    the request arrived (the first starts at 0, each starts where the one before ended, so
    they add up to its latency on the server's clock), and `reasons`: the runs of wait codes
    of this module it had in that stretch, each with its code, steps, first and last step and
    its last fields (never another request's id).

    What the loop builds for each student's request (engine/server/loop.py) and the phone and
    the projector draw; `add_report` reads a StepReport dict, for a recording or a test."""

    def __init__(self):
        self.stretches: list[dict] = []
        self.prefilling = True  # its prompt (or, after a preemption, its recompute) is not done
        self.truncated = False

    def add(self, step: int, end_ms: float, *, waiting: bool, seated: bool, admitted: bool,
            finished: bool, wait: dict | None) -> str | None:
        """One step of the request: in the queue (`waiting`), in a seat that is not a static
        bus's finished rider (`seated`), boarded in this step (`admitted`), finished in it;
        `wait` its code and fields this step, if any. Returns the phase, None when the step
        did not concern it."""
        code = (wait or {}).get("code")
        if waiting:
            phase = "preempted" if code == "preempted" else "queued"
            self.prefilling = True
        elif seated or finished:
            phase = "prefill" if self.prefilling or admitted else "decode"
            # a chunk, or a step the budget skipped, leaves the prompt unfinished
            self.prefilling = (phase == "prefill" and not finished
                               and code in ("prefill_chunk", "token_budget"))
        else:
            return None
        last = self.stretches[-1] if self.stretches else None
        if last is None or ((last["phase"] != phase or phase == "preempted")
                            and len(self.stretches) < MAX_STRETCHES):
            start = last["end_ms"] if last else 0.0
            last = {"phase": phase, "from_step": step, "to_step": step, "steps": 0,
                    "start_ms": start, "end_ms": start, "reasons": []}
            self.stretches.append(last)
        elif last["phase"] != phase:
            self.truncated = True
        last["to_step"], last["end_ms"] = step, round(max(end_ms, last["start_ms"]), 1)
        last["steps"] += 1
        if code:
            fields = {k: v for k, v in wait.items() if k != "code" and k not in PRIVATE_FIELDS}
            runs = last["reasons"]
            run = runs[-1] if runs and runs[-1]["code"] == code else None
            if run is None and len(runs) >= MAX_REASONS:
                run = next((r for r in runs if r["code"] == code), None)
            if run is None:
                run = {"code": code, "steps": 0, "from_step": step, "to_step": step,
                       "fields": {}}
                runs.append(run)
            run["steps"] += 1
            run["to_step"], run["fields"] = step, fields
        return phase

    def add_report(self, rid: str, report: dict, end_ms: float) -> str | None:
        """One step from a StepReport dict."""
        seated = any(s["request_id"] == rid and s["state"] != "idle-finished"
                     for s in report["seats"])
        return self.add(report["step"], end_ms, waiting=rid in report["waiting"], seated=seated,
                        admitted=rid in report.get("admitted", []),
                        finished=rid in report.get("finished", []),
                        wait=(report.get("waits") or {}).get(rid))

    def to_list(self) -> list[dict]:
        """The stretches as JSON-able data (a copy)."""
        return [{**s, "reasons": [{**r, "fields": dict(r["fields"])}
                                  for r in s["reasons"]]} for s in self.stretches]

    def codes(self) -> list[str]:
        """Every wait code it had, in order of first appearance."""
        return list(dict.fromkeys(r["code"] for s in self.stretches for r in s["reasons"]))
