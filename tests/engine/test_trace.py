"""A run as a trace (engine/trace.py): a real engine's reports become Trace Event Format JSON
that validates against the format's published rules (Google's "Trace Event Format" document:
the JSON object form, complete "X" events with ts and dur, "C" counters with numeric args,
"M" metadata naming processes and threads, "s"/"f" flow events with an id), each request's
slices tile its time on the step clock and name the engine's own wait codes, each seat holds
one rider at a time, and the CLI converts a recording, the server writes one as it serves."""

from __future__ import annotations

import json
import threading

import httpx
import jsonschema
import pytest

from engine.trace import REQUESTS_PID, SEATS_PID, TraceWriter, main, trace_of

NUMBER = {"type": "number"}
# the format's rules for the event types a ServeLab trace uses
SCHEMA = {
    "type": "object",
    "required": ["traceEvents"],
    "properties": {
        "displayTimeUnit": {"enum": ["ms", "ns"]},
        "traceEvents": {"type": "array", "items": {
            "type": "object",
            "required": ["ph", "name", "pid", "tid"],
            "properties": {"ph": {"enum": ["X", "C", "M", "s", "f"]}, "name": {"type": "string"},
                           "pid": {"type": "integer"}, "tid": {"type": "integer"},
                           "ts": NUMBER, "args": {"type": "object"}},
            "allOf": [
                {"if": {"properties": {"ph": {"const": "X"}}},
                 "then": {"required": ["ts", "dur"],
                          "properties": {"dur": {"type": "number", "minimum": 0}}}},
                {"if": {"properties": {"ph": {"const": "C"}}},
                 "then": {"required": ["ts", "args"], "properties": {"args": {
                     "type": "object", "additionalProperties": NUMBER, "minProperties": 1}}}},
                {"if": {"properties": {"ph": {"const": "M"}}},
                 "then": {"required": ["args"], "properties": {
                     "name": {"enum": ["process_name", "thread_name", "process_sort_index",
                                       "thread_sort_index"]},
                     "args": {"type": "object", "required": ["name"]}}}},
                {"if": {"properties": {"ph": {"enum": ["s", "f"]}}},
                 "then": {"required": ["ts", "id", "cat"]}},
                {"if": {"properties": {"ph": {"const": "f"}}},
                 "then": {"properties": {"bp": {"const": "e"}}}},
            ]}},
    },
}


@pytest.fixture(scope="module", params=[("continuous", "paged"), ("static", "contiguous")],
                ids=lambda p: "-".join(p))
def run(request):
    """Two seats, six requests of different lengths, and a small step budget: requests wait
    for seats, a long prompt is chunked; the reports and what the engine measured."""
    from engine import EngineConfig, LLMEngine, SamplingParams

    batching, layout = request.param
    eng = LLMEngine(EngineConfig(dtype="float32", batching=batching, kv_layout=layout,
                                 max_num_seqs=2, max_num_batched_tokens=32))
    rids = [eng.add_request(("Tell me about the sea. " * (6 if i == 3 else 1)) + str(i),
                            SamplingParams(max_tokens=2 + i, ignore_eos=True))
            for i in range(6)]
    history = []
    while eng.has_unfinished():
        history.append(eng.step().to_dict())
    return rids, history


def test_the_trace_follows_the_trace_event_format(run):
    _, history = run
    trace = json.loads(json.dumps(trace_of(history)))  # what a file holds
    jsonschema.validate(trace, SCHEMA)
    names = {(e["pid"], e["args"]["name"]) for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert {n for _, n in names} == {"seats", "requests", "engine"}


def test_each_requests_slices_tile_its_time_and_name_its_waits(run):
    rids, history = run
    trace = trace_of(history)
    events = trace["traceEvents"]
    tid_of = {e["args"]["name"].removeprefix("request "): e["tid"] for e in events
              if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == REQUESTS_PID}
    assert set(tid_of) == set(rids)
    starts, t = [], 0.0
    for rep in history:
        starts.append(t)
        t += rep["wall_s"]
    for rid in rids:
        slices = sorted((e for e in events if e["ph"] == "X" and e["pid"] == REQUESTS_PID
                         and e["tid"] == tid_of[rid]), key=lambda e: e["ts"])
        assert slices, rid
        for a, b in zip(slices, slices[1:]):  # back to back: no gap, no overlap
            assert b["ts"] == pytest.approx(a["ts"] + a["dur"], abs=0.01), (rid, a, b)
        # from the start of its first step to the end of the step that finished it
        first = next(i for i, r in enumerate(history) if rid in r["waiting"]
                     or rid in r["admitted"] or rid in r["finished"])
        last = next(i for i, r in enumerate(history) if rid in r["finished"])
        expected = sum(r["wall_s"] for r in history[first:last + 1]) * 1e6
        assert sum(e["dur"] for e in slices) == pytest.approx(expected, rel=1e-6, abs=0.05)
        assert slices[0]["ts"] == pytest.approx(starts[first] * 1e6, abs=0.01)
        # each step it waited, a slice covers that step and carries the engine's code
        for i, rep in enumerate(history):
            if rid in rep["waiting"]:
                ts = starts[i] * 1e6 + 0.5
                (s,) = [e for e in slices if e["ts"] <= ts < e["ts"] + e["dur"]]
                assert s["name"] == f"wait: {rep['waits'][rid]['code']}"
    codes = {e["name"] for e in events if e["ph"] == "X" and e["name"].startswith("wait: ")}
    assert codes, "nobody waited"


def test_a_seat_holds_one_rider_at_a_time_and_flows_lead_to_who_boarded(run):
    _, history = run
    events = trace_of(history)["traceEvents"]
    seats = {}
    for e in events:
        if e["ph"] == "X" and e["pid"] == SEATS_PID:
            seats.setdefault(e["tid"], []).append(e)
    assert seats
    for tid, slices in seats.items():
        slices.sort(key=lambda e: e["ts"])
        for a, b in zip(slices, slices[1:]):
            assert a["ts"] + a["dur"] <= b["ts"] + 0.01, (tid, a, b)
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    assert starts and set(starts) == set(ends)
    for i, f in ends.items():
        assert starts[i]["ts"] < f["ts"] and f["args"]["boarded"] != starts[i]["args"]["left"]
    counters = {e["name"] for e in events if e["ph"] == "C"}
    assert {"KV blocks in use", "queue", "tokens per step", "waiting by reason"} <= counters


def test_flows_lead_from_a_finish_to_the_end_of_the_wait_it_ended(run):
    """On the requests' tracks: each flow starts inside the finished request's last slice and
    binds (bp "e") inside the slice of whoever took its seat: the end of that one's wait."""
    rids, history = run
    events = trace_of(history)["traceEvents"]
    rid_of = {e["tid"]: e["args"]["name"].removeprefix("request ") for e in events
              if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == REQUESTS_PID}
    slices: dict[int, list[dict]] = {}
    for e in events:
        if e["ph"] == "X" and e["pid"] == REQUESTS_PID:
            slices.setdefault(e["tid"], []).append(e)

    def enclosing(tid, ts):
        (s,) = [e for e in slices[tid] if e["ts"] <= ts < e["ts"] + e["dur"]]
        return s

    starts = {e["id"]: e for e in events if e["ph"] == "s" and e["cat"] == "wait"}
    ends = {e["id"]: e for e in events if e["ph"] == "f" and e["cat"] == "wait"}
    assert starts and set(starts) == set(ends)
    waited = 0
    for i, f in ends.items():
        s = starts[i]
        assert s["pid"] == f["pid"] == REQUESTS_PID and s["ts"] < f["ts"]
        assert rid_of[s["tid"]] == s["args"]["left"] and rid_of[f["tid"]] == f["args"]["boarded"]
        last = max(slices[s["tid"]], key=lambda e: e["ts"])
        assert enclosing(s["tid"], s["ts"]) is last  # the finish
        bound = enclosing(f["tid"], f["ts"])
        if bound["name"].startswith("wait: "):  # and its wait ends where the next slice starts
            waited += 1
            assert any(e["ts"] == pytest.approx(bound["ts"] + bound["dur"], abs=0.01)
                       and not e["name"].startswith("wait: ") for e in slices[f["tid"]])
    assert waited >= 1  # someone waited for a seat that a finish freed


def test_recent_steps_keep_a_bounded_window_for_a_trace_on_demand(run):
    from engine.trace import RecentSteps

    _, history = run
    recent = RecentSteps("class")
    for r in history:
        recent.report(r)
    trace = json.loads(json.dumps(recent.trace()))
    jsonschema.validate(trace, SCHEMA)
    assert trace == json.loads(json.dumps(trace_of(history, "class")))  # all of it kept
    small = RecentSteps("class", max_steps=5)
    for r in history:
        small.report(r)
    assert small.trace()["otherData"]["steps"] == 5
    few = RecentSteps("class", max_entries=4)
    for r in history:
        few.report(r)
    assert 1 <= len(few.steps) < len(history) and (few.entries <= 4 or len(few.steps) == 1)
    jsonschema.validate(few.trace(), SCHEMA)


def test_the_cli_turns_a_recording_into_a_trace(run, tmp_path, capsys):
    from engine.recording import Recorder

    _, history = run
    path = tmp_path / "run.jsonl.gz"
    rec = Recorder(str(path), {"model": "test"}, {"cpu": "test"}, source="engine")
    for r in history:
        rec.report(r)
    rec.close()
    out = tmp_path / "trace.json"
    assert main([str(path), "-o", str(out)]) == 0
    assert json.loads(out.read_text()) == json.loads(json.dumps(trace_of(history, str(path))))
    with pytest.raises(SystemExit):
        main([str(tmp_path / "missing.jsonl.gz"), "-o", str(out)])
    assert "missing.jsonl.gz" in capsys.readouterr().err


@pytest.mark.slow
def test_a_server_writes_its_trace(engine, tmp_path):
    """The server's step loop feeds the trace as it does the recorder (`engine.serve --trace`)."""
    from tests.conftest import running_server

    out = tmp_path / "served.json"
    with running_server(engine) as (url, app), httpx.Client(base_url=url, timeout=60) as c:
        app.state.loop.tracer = tracer = TraceWriter(str(out))
        askers = [threading.Thread(target=lambda i=i: c.post("/v1/completions", json={
            "model": "smollm2-135m", "prompt": f"Say {i}", "max_tokens": 3,
            "ignore_eos": True})) for i in range(10)]
        for t in askers:
            t.start()
        for t in askers:
            t.join(60)
        app.state.loop.tracer = None
    tracer.close()
    trace = json.loads(out.read_text())
    jsonschema.validate(trace, SCHEMA)
    requests = {e["args"]["name"] for e in trace["traceEvents"]
                if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == REQUESTS_PID}
    assert len(requests) == 10
    assert any(e["name"].startswith("wait: ") for e in trace["traceEvents"] if e["ph"] == "X")


def test_serve_takes_a_trace_path():
    from engine.serve import build_parser

    assert build_parser().parse_args(["--trace", "t.json"]).trace == "t.json"

