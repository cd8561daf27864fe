"""A run as a trace that Perfetto's UI (ui.perfetto.dev) and chrome://tracing open: the Trace
Event Format's JSON object form, built from StepReport dicts (an engine's, the app's, a class
server's, or a recording's: `python -m engine.trace RECORDING.jsonl.gz -o trace.json`;
`python -m engine.serve --trace trace.json` writes one as it serves).

What it holds, on the engine's step clock (each step starts where the one before ended and
lasts its measured `wall_s`; the gaps between steps, when the engine had nothing to do, are
left out):
  * process "seats": one track per seat, a slice per rider (its request id; its state in the
    args), so batching's shape shows as rows of bars;
  * process "requests": one track per request, its life as back-to-back slices: "wait: <code>"
    (why, from engine/waits.py, with its counts in the args), "prefill", "decode", and they
    tile the request's time from its first step in the engine to the end of the step that
    finished it, so they add up to its latency on that clock;
  * counters: KV blocks in use, the queue's length, tokens computed per step, and the waiting
    requests by code;
  * flows: from the finish that freed a seat to the request that boarded it next, on the
    seats' tracks ("seat freed") and on the requests' ("freed its seat": from the finished
    request's last slice to the end of the newcomer's wait, so a wait: seats_full slice
    shows whose finish ended it).

`RecentSteps` keeps a server's recent steps for a trace on demand (the class server's
`GET /v1/servelab/class/trace`, the Classroom page's download).

Pure (no torch): the app builds a trace from a session's history or a recording.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable

SEATS_PID, REQUESTS_PID, ENGINE_PID = 1, 2, 3
US = 1e6  # the format's timestamps are microseconds


class TraceBuilder:
    """Add report dicts one step at a time (`add`); `trace()` is the JSON object."""

    def __init__(self, name: str = "ServeLab", run: int = 0, label: str = ""):
        """`run` and `label`: one of several runs in one trace (the app's side-by-side
        runs), its processes numbered and named apart."""
        self.name, self.label = name, label
        self.pids = tuple(3 * run + p for p in (SEATS_PID, REQUESTS_PID, ENGINE_PID))
        self.events: list[dict] = []
        self.t = 0.0  # the step clock, in seconds
        self.request_tid: dict[str, int] = {}
        self._rid_of: dict[int, str] = {}
        self.open: dict[str, tuple[str, float, dict]] = {}  # rid -> (phase, start, args)
        self.seat_open: dict[int, tuple[str, float, str]] = {}  # seat -> (rid, start, state)
        self.freed: dict[int, tuple[str, float]] = {}  # seat -> (who left it, when)
        self.finished_at: dict[str, float] = {}  # rid -> the end of the step that finished it
        self.waited: dict[str, tuple[float, float]] = {}  # rid -> its last wait slice's span
        self.named_seats: set[int] = set()
        self.flows = 0
        self.steps = 0

    # --- one step ---------------------------------------------------------------------------
    def add(self, report: dict) -> None:
        start, end = self.t, self.t + max(0.0, float(report.get("wall_s") or 0.0))
        waits = report.get("waits") or {}
        finished = set(report.get("finished") or []) | set(report.get("aborted") or [])
        seen: dict[str, tuple[str, dict]] = {}
        for rid in report.get("waiting") or []:
            w = waits.get(rid) or {}
            code = w.get("code", "queued")
            seen[rid] = (f"wait: {code}", {k: v for k, v in w.items() if k != "code"})
        admitted = set(report.get("admitted") or [])
        seats_now: dict[int, tuple[str, str]] = {}
        for seat in report.get("seats") or []:
            rid = seat.get("request_id")
            if rid is None:
                continue
            seats_now[seat["index"]] = (rid, seat["state"])
            if seat["state"] == "idle-finished" or rid in seen:
                continue
            # the seat's state is the one after the step: a request that boarded in it, or
            # is still reading its prompt, computed prompt tokens in it
            prefill = (seat["state"] == "prefill" or rid in admitted
                       or (waits.get(rid) or {}).get("code") == "prefill_chunk")
            seen[rid] = ("prefill" if prefill else "decode", {"seat": seat["index"]})
        for rid in finished:  # it left in this step: its last slice ends with the step
            if rid not in seen:
                seen[rid] = (self.open[rid][0], self.open[rid][2]) if rid in self.open \
                    else ("prefill", {})  # boarded and finished within this one step
        self._requests(seen, start, end, finished)
        self._seats(seats_now, start, report.get("step"))
        self._counters(report, start, waits)
        self.t = end
        self.steps += 1

    def _requests(self, seen: dict, start: float, end: float, finished: set) -> None:
        for rid, (phase, args) in seen.items():
            if rid not in self.request_tid:
                self.request_tid[rid] = len(self.request_tid) + 1
                self._rid_of[self.request_tid[rid]] = rid
                self._meta(self.pids[1], self.request_tid[rid], f"request {rid}")
            tid = self.request_tid[rid]
            cur = self.open.get(rid)
            if cur is not None and (cur[0] != phase or cur[2] != args):
                self._slice(self.pids[1], tid, cur[0], cur[1], start, cur[2])
                cur = None
            if cur is None:
                self.open[rid] = (phase, start, args)
        for rid in [r for r in self.open if r not in seen]:  # gone without a finish: aborted
            phase, t0, args = self.open.pop(rid)
            self._slice(self.pids[1], self.request_tid[rid], phase, t0, start, args)
        for rid in finished:
            if rid in self.open:
                phase, t0, args = self.open.pop(rid)
                self._slice(self.pids[1], self.request_tid[rid], phase, t0, end, args)
                self.finished_at[rid] = end

    def _seats(self, seats_now: dict, start: float, step) -> None:
        for index in set(self.seat_open) | set(seats_now):
            cur, now = self.seat_open.get(index), seats_now.get(index)
            if cur is not None and (now is None or now[0] != cur[0]):
                self._slice(self.pids[0], index + 1, cur[0], cur[1], start, {"state": cur[2]})
                self.freed[index] = (cur[0], start)
                del self.seat_open[index]
                cur = None
            if now is not None and cur is None:
                if index + 1 not in self.named_seats:
                    self.named_seats.add(index + 1)
                    self._meta(self.pids[0], index + 1, f"seat {index}")
                self.seat_open[index] = (now[0], start, now[1])
                if index in self.freed:  # the finish that freed this seat, to who took it
                    left, t_left = self.freed.pop(index)
                    self.flows += 1
                    common = {"cat": "seat", "name": "seat freed", "id": self.flows,
                              "pid": self.pids[0], "tid": index + 1}
                    self.events.append({**common, "ph": "s", "ts": _us(t_left) - 1,
                                        "args": {"left": left}})
                    self.events.append({**common, "ph": "f", "bp": "e", "ts": _us(start),
                                        "args": {"boarded": now[0], "step": step}})
                    self._wait_flow(left, now[0], start, step)

    def _wait_flow(self, left: str, boarded: str, start: float, step) -> None:
        """On the requests' tracks: from the finish of `left` (its last slice) to the end of
        the wait of `boarded`, who took the seat it freed in the step that starts at `start`
        (to its first slice when it did not wait)."""
        if left not in self.finished_at or left not in self.request_tid \
                or boarded not in self.request_tid:
            return  # the seat's rider left without a finish (aborted): nothing freed it
        t_end = self.finished_at[left]
        span = self.waited.get(boarded)
        # inside its wait slice, which ends where the step that seated it starts (half a
        # microsecond after the finish's point, which is one before its slice's end)
        waited = (span is not None and abs(span[1] - start) < 1e-9
                  and _us(start) - _us(span[0]) > 0.5)
        ts = _us(start) - 0.5 if waited else _us(start)
        self.flows += 1
        common = {"cat": "wait", "name": "freed its seat", "id": self.flows,
                  "pid": self.pids[1]}
        self.events.append({**common, "ph": "s", "tid": self.request_tid[left],
                            "ts": max(0.0, _us(t_end) - 1), "args": {"left": left}})
        self.events.append({**common, "ph": "f", "bp": "e", "tid": self.request_tid[boarded],
                            "ts": ts, "args": {"boarded": boarded, "step": step}})

    def _counters(self, report: dict, start: float, waits: dict) -> None:
        kv = report.get("kv") or {}
        ts = _us(start)
        counters = {
            "KV blocks in use": {"blocks": kv.get("num_blocks", 0) - kv.get("free_blocks", 0)},
            "queue": {"requests": len(report.get("waiting") or [])},
            "tokens per step": {"tokens": report.get("num_batched_tokens", 0)},
        }
        by_code: dict[str, int] = {}
        for rid in report.get("waiting") or []:
            code = (waits.get(rid) or {}).get("code", "queued")
            by_code[code] = by_code.get(code, 0) + 1
        counters["waiting by reason"] = by_code or {"none": 0}
        for name, args in counters.items():
            self.events.append({"ph": "C", "name": name, "pid": self.pids[2], "tid": 0,
                                "ts": ts, "args": args})

    # --- the file ---------------------------------------------------------------------------
    def trace(self) -> dict:
        """The trace so far, with the open slices closed at the clock's end."""
        events = list(self.events)
        end = self.t
        for rid, (phase, t0, args) in self.open.items():
            events.append(_x(self.pids[1], self.request_tid[rid], phase, t0, end, args))
        for index, (rid, t0, state) in self.seat_open.items():
            events.append(_x(self.pids[0], index + 1, rid, t0, end, {"state": state}))
        tag = f" ({self.label})" if self.label else ""
        meta = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                 "args": {"name": name + tag}}
                for pid, name in zip(self.pids, ("seats", "requests", "engine"))]
        return _trace_file(meta + events, self.name, self.steps)

    def _slice(self, pid: int, tid: int, name: str, t0: float, t1: float, args: dict) -> None:
        self.events.append(_x(pid, tid, name, t0, t1, args))
        if pid == self.pids[1] and name.startswith("wait: "):
            self.waited[self._rid_of[tid]] = (t0, t1)

    def _meta(self, pid: int, tid: int, name: str) -> None:
        self.events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                            "args": {"name": name}})


def _us(seconds: float) -> float:
    return round(seconds * US, 3)


def _x(pid: int, tid: int, name: str, t0: float, t1: float, args: dict) -> dict:
    return {"ph": "X", "name": name, "pid": pid, "tid": tid, "ts": _us(t0),
            "dur": round(_us(t1) - _us(t0), 3), "args": dict(args)}


def trace_of(reports: Iterable[dict], name: str = "ServeLab") -> dict:
    """A whole run's trace."""
    return traces_of([("", reports)], name)


def traces_of(runs: Iterable[tuple[str, Iterable[dict]]], name: str = "ServeLab") -> dict:
    """Several runs (label, reports) in one trace, each in processes of its own."""
    events: list[dict] = []
    steps = 0
    for i, (label, reports) in enumerate(runs):
        b = TraceBuilder(name, run=i, label=label)
        for r in reports:
            b.add(r)
        events += b.trace()["traceEvents"]
        steps += b.steps
    return _trace_file(events, name, steps)


def _trace_file(events: list[dict], source: str, steps: int) -> dict:
    """The format's JSON object form around `events`."""
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"source": source, "steps": steps,
                          "clock": "engine steps: each lasts its measured wall_s"}}


class TraceWriter:
    """A server's sink beside its recorder (`report(dict)` each step, `close()` at the end):
    the trace goes to `path` when the server stops."""

    def __init__(self, path: str):
        self.path, self.builder = path, TraceBuilder("python -m engine.serve")

    def report(self, report: dict, run: int = 0) -> None:
        self.builder.add(report)

    def close(self) -> None:
        with open(self.path, "w", encoding="utf-8") as f:
            json.dump(self.builder.trace(), f, ensure_ascii=False)


# what a trace reads of a report (TraceBuilder.add): the rest of it stays out of RecentSteps
_TRACED = ("step", "wall_s", "waits", "waiting", "admitted", "finished", "aborted",
           "num_batched_tokens")


def traced(report) -> dict:
    """A StepReport, or its dict, cut to what a trace reads (its lists and `waits` shared,
    not copied: each step's report is new and nothing changes one). From the object it
    costs no `to_dict` (about a millisecond a step on a class server)."""
    if not isinstance(report, dict):
        d = {k: getattr(report, k) for k in _TRACED}
        d["seats"] = [{"index": s.index, "request_id": s.request_id, "state": s.state}
                      for s in report.seats]
        d["kv"] = {"num_blocks": report.kv.num_blocks, "free_blocks": report.kv.free_blocks}
        return d
    d = {k: report[k] for k in _TRACED if k in report}
    d["waits"], d["waiting"] = report.get("waits") or {}, report.get("waiting") or []
    d["seats"] = [{"index": s["index"], "request_id": s["request_id"], "state": s["state"]}
                  for s in report.get("seats") or []]
    kv = report.get("kv") or {}
    d["kv"] = {"num_blocks": kv.get("num_blocks", 0), "free_blocks": kv.get("free_blocks", 0)}
    return d


class RecentSteps:
    """A server's sink (`report(step_report)` each step, from the stepping thread: the
    StepReport itself, or its dict) that keeps its recent steps, cut to what a trace reads,
    and makes their trace on demand (`trace()`, from any thread): the class server's trace
    download. Bounded by steps and by the requests they name (a thousand simulated users in
    the queue name a thousand each step)."""

    def __init__(self, name: str = "ServeLab", max_steps: int = 2000,
                 max_entries: int = 100_000):
        import threading
        from collections import deque

        self.name, self.max_entries = name, max_entries
        self.steps: deque[tuple[dict, int]] = deque(maxlen=max_steps)
        self.entries = 0
        self.lock = threading.Lock()

    def report(self, report, run: int = 0) -> None:
        d = traced(report)
        n = len(d["waits"]) + len(d["waiting"]) + len(d["seats"])
        with self.lock:
            if len(self.steps) == self.steps.maxlen:
                self.entries -= self.steps[0][1]
            self.steps.append((d, n))
            self.entries += n
            while self.entries > self.max_entries and len(self.steps) > 1:
                self.entries -= self.steps.popleft()[1]

    def trace(self) -> dict:
        with self.lock:
            reports = [d for d, _ in self.steps]
        return trace_of(reports, self.name)


def main(argv: list[str] | None = None) -> int:
    from engine.recording import RecordingError, read_recording

    ap = argparse.ArgumentParser(prog="python -m engine.trace",
                                 description="a recording as a trace for Perfetto's UI")
    ap.add_argument("recording", help="a ServeLab recording (.jsonl.gz)")
    ap.add_argument("-o", "--out", required=True, help="the trace JSON to write")
    ap.add_argument("--run", type=int, default=0, help="which of the recording's runs")
    args = ap.parse_args(argv)
    try:
        rec = read_recording(args.recording)
    except (OSError, RecordingError) as exc:
        ap.error(str(exc))
    if not 0 <= args.run < len(rec.runs):
        ap.error(f"--run {args.run}: the recording has {len(rec.runs)} run(s)")
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(trace_of(rec.runs[args.run], args.recording), f, ensure_ascii=False)
    print(f"wrote {args.out}: {len(rec.runs[args.run])} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
