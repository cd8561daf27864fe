"""Why a request waits (engine/waits.py): one constructed scenario per code, on the scheduler
with no model (a fake loop advances what it schedules, as the engine does), asserting the
code and its fields in each switch combination where the code can occur; the property that
every waiting request has exactly one code is in test_scheduler_props.py."""

from __future__ import annotations

import pytest

from engine.config import EngineConfig, SamplingParams
from engine.kv import ContiguousAllocator, PagedAllocator
from engine.request import Request
from engine.scheduler import Scheduler
from engine.waits import WAIT_CODES, Timeline, Wait, waiting_by_reason
from tests.conftest import computed_prompt


def _scheduler(layout="paged", batching="continuous", seats=4, budget=64, blocks=None,
               block_size=4, max_model_len=32) -> Scheduler:
    cfg = EngineConfig(batching=batching, kv_layout=layout, max_num_seqs=seats,
                       block_size=block_size, max_model_len=max_model_len,
                       max_num_batched_tokens=budget, enable_prefix_caching=False)
    n = blocks if blocks is not None else cfg.blocks_per_seq * seats
    alloc = (PagedAllocator(n, block_size, False) if layout == "paged"
             else ContiguousAllocator(n, block_size, max_model_len))
    return Scheduler(cfg, alloc, eos_ids=set())


def _add(sched: Scheduler, rid: str, prompt: int, out: int = 4) -> Request:
    req = Request(rid, [1 + i % 5 for i in range(prompt)], SamplingParams(max_tokens=out))
    sched.add(req)
    return req


def _step(sched: Scheduler):
    """One scheduled step, advanced as the engine would (every caught-up request samples 7)."""
    out = sched.schedule()
    sampled = {s.req.request_id: [7] for s in out.scheduled
               if not s.idle and s.req.num_computed_tokens + s.num_tokens == s.req.num_tokens}
    sched.update_from_output(out, sampled, now=0.0)
    return out


@pytest.mark.parametrize("layout", ["paged", "contiguous"])
def test_all_seats_taken(layout):
    sched = _scheduler(layout, seats=1)
    _add(sched, "a", 4)
    _add(sched, "b", 4)
    out = _step(sched)
    assert out.waits["b"] == Wait("seats_full", {"seats": 1, "taken": 1})
    assert "a" not in out.waits


@pytest.mark.parametrize("layout", ["paged", "contiguous"])
def test_queued_behind_names_the_head_and_its_reason(layout):
    sched = _scheduler(layout, seats=1)
    for rid in "abcd":
        _add(sched, rid, 4)
    out = _step(sched)
    assert out.waits["b"].code == "seats_full"
    assert out.waits["c"] == Wait("queued_behind", {"position": 1, "behind": "b",
                                                    "head_code": "seats_full"})
    assert out.waits["d"].fields["position"] == 2


@pytest.mark.parametrize("layout", ["paged", "contiguous"])
def test_the_token_budget_spent_before_its_turn(layout):
    sched = _scheduler(layout, budget=8)
    _add(sched, "a", 8)
    _add(sched, "b", 4)
    out = _step(sched)
    assert out.waits["b"] == Wait("token_budget", {"budget": 8})


def test_a_long_prompt_computes_a_chunk():
    sched = _scheduler(budget=4)
    _add(sched, "a", 10)
    out = _step(sched)
    assert out.waits["a"] == Wait("prefill_chunk", {"computed": 4, "remaining": 6})
    out = _step(sched)  # already running: its next chunk
    assert out.waits["a"] == Wait("prefill_chunk", {"computed": 4, "remaining": 2})
    out = _step(sched)
    assert "a" not in out.waits  # the last chunk is the whole rest


@pytest.mark.parametrize("layout", ["paged", "contiguous"])
def test_the_tour_bus_is_not_back(layout):
    sched = _scheduler(layout, batching="static", seats=2)
    _add(sched, "a", 4, out=6)
    _add(sched, "b", 4, out=1)
    _step(sched)
    _step(sched)  # b is done, a rides on; the bus does not board
    _add(sched, "c", 4)
    out = _step(sched)
    assert out.waits["c"] == Wait("bus_running", {"riders_left": 1})


def test_a_seated_rider_whose_prompt_waits_for_the_budget():
    """Static batching seats the whole bus at once; prompts beyond the budget compute later."""
    sched = _scheduler(batching="static", seats=2, budget=4)
    _add(sched, "a", 4)
    _add(sched, "b", 4)
    out = _step(sched)
    assert out.admitted == ["a", "b"] and out.waits["b"] == Wait("token_budget", {"budget": 4})


def test_paged_kv_short_for_the_first_chunk():
    # a's 8 prompt tokens and its first output take 3 blocks of 4; b's prompt needs 2 of the 1
    sched = _scheduler("paged", blocks=4)
    _add(sched, "a", 8, out=2)
    _step(sched)
    _add(sched, "b", 8)
    out = _step(sched)
    assert out.waits["b"] == Wait("kv_short", {"needed": 2, "free": 1})


def test_contiguous_kv_short_and_fragmented():
    # each reservation is prompt + max_tokens: 4 + 4 = 8 tokens = 2 blocks of 4
    sched = _scheduler("contiguous", seats=8, blocks=7)
    for rid in "abc":
        _add(sched, rid, 4)
    _step(sched)  # a [0,2) b [2,4) c [4,6), one block free
    _add(sched, "d", 4)
    out = _step(sched)
    assert out.waits["d"] == Wait("kv_short", {"needed": 2, "free": 1})
    sched.abort(next(r for r in sched.running if r.request_id == "a"))  # a hole of 2 at 0
    _add(sched, "e", 8)  # e needs 3 blocks in a row: 3 free (2 + 1), none 3 long
    sched.waiting.rotate(1)  # e first, for the test
    out = _step(sched)
    assert out.waits["e"] == Wait("kv_fragmented", {"needed": 3, "free": 3,
                                                    "largest_free_run": 2})


def test_preempted_to_make_room_says_what_it_must_redo():
    sched = _scheduler("paged", blocks=4, budget=64)
    _add(sched, "a", 7, out=8)
    _add(sched, "b", 7, out=8)
    for _ in range(10):
        out = _step(sched)
        if out.preempted:
            break
    else:
        raise AssertionError("no preemption")
    (victim,) = out.preempted
    w = out.waits[victim]
    assert w.code == "preempted" and w.fields["rule"] == "recompute"
    assert w.fields["redo_tokens"] >= 7 and w.fields["for_request"] != victim


def test_an_unknown_code_is_refused():
    with pytest.raises(ValueError, match="unknown wait code"):
        Wait("tired")


def test_waiting_by_reason_counts_every_code():
    counts = waiting_by_reason({"a": {"code": "seats_full"}, "b": {"code": "queued_behind"},
                                "c": {"code": "prefill_chunk"}}, ["a", "b"])
    assert set(counts) == set(WAIT_CODES) and sum(counts.values()) == 2
    assert counts["seats_full"] == counts["queued_behind"] == 1


@pytest.mark.parametrize(("batching", "layout", "head_code"), [
    ("static", "contiguous", "bus_running"), ("continuous", "paged", "seats_full")])
def test_the_engines_reports_carry_the_waits_and_the_page_says_them(batching, layout,
                                                                     head_code, monkeypatch):
    """A real engine (two seats, five requests): every report gives each waiting request its
    code; the batching page's queue says the head's reason in the page's language with each
    chip's own reason as its tooltip, and the chart of reasons counts them step by step."""
    from app.components import seats
    from engine import EngineConfig, LLMEngine, SamplingParams

    eng = LLMEngine(EngineConfig(dtype="float32", batching=batching, kv_layout=layout,
                                 max_num_seqs=2))
    for i in range(5):
        eng.add_request(f"Count to {i}:", SamplingParams(max_tokens=2 + i, ignore_eos=True))
    history = []
    while eng.has_unfinished():
        history.append(eng.step().to_dict())
    waited = [r for r in history if r["waiting"]]
    assert waited
    for rep in waited:
        assert set(rep["waiting"]) <= set(rep["waits"])
    rep = next(r for r in waited if r["waits"][r["waiting"][0]]["code"] == head_code)
    for lang, word in (("en", "ahead"), ("zh", "前面还有")):
        monkeypatch.setattr("app.i18n.get_lang", lambda lang=lang: lang)
        out = seats.queue_html(rep)
        assert seats.wait_text(rep["waits"][rep["waiting"][0]]) in out
        if len(rep["waiting"]) > 1:
            assert word in out  # the second in line's tooltip
    df = seats.waits_frame(history)
    assert df["requests"].sum() == sum(len(r["waits"]) for r in history)
    assert seats.waits_chart(history) is not None and seats.waits_chart(history[:0]) is None
    # each request's own timeline from the same reports: back to back from 0 ms, a queued
    # stretch for each step it waited, and the very codes the reports gave it
    ends, t = [], 0.0
    for rep in history:
        t += 1000 * rep["wall_s"]
        ends.append(t)
    for rid in {r for rep in history for r in [*rep["waiting"], *rep["admitted"]]}:
        tl = Timeline()
        for rep, end in zip(history, ends):
            tl.add_report(rid, rep, end)
        got = tl.to_list()
        assert got[0]["start_ms"] == 0.0 and got[-1]["phase"] == "decode"
        for a, b in zip(got, got[1:]):
            assert b["start_ms"] == a["end_ms"] and b["from_step"] == a["to_step"] + 1
        queued = {s for st in got if st["phase"] == "queued"
                  for s in range(st["from_step"], st["to_step"] + 1)}
        assert queued == {rep["step"] for rep in history if rid in rep["waiting"]}, rid
        sent = [rep["waits"][rid]["code"] for rep in history if rid in rep["waits"]]
        assert tl.codes() == list(dict.fromkeys(sent))
        assert sum(r["steps"] for st in got for r in st["reasons"]) == len(sent)
        assert "prefill" in [st["phase"] for st in got]
        assert all("behind" not in r["fields"] for st in got for r in st["reasons"])


def test_a_timeline_tells_chunks_preemption_and_the_recompute_apart():
    """One request's steps as the loop sees them: two stretches of waiting reasons, a chunked
    prompt, decode, a preemption, the queue again, the recompute and decode to the end."""
    tl = Timeline()
    steps = [  # (waiting, seated, admitted, finished, wait)
        (True, False, False, False, {"code": "seats_full", "seats": 2, "taken": 2}),
        (True, False, False, False, {"code": "queued_behind", "position": 1, "behind": "x",
                                     "head_code": "seats_full"}),
        (False, True, True, False, {"code": "prefill_chunk", "computed": 8, "remaining": 4}),
        (False, True, False, False, None),  # the last chunk
        (False, True, False, False, None),
        (True, False, False, False, {"code": "preempted", "rule": "recompute",
                                     "redo_tokens": 13, "for_request": "y"}),
        (True, False, False, False, {"code": "kv_short", "needed": 2, "free": 1}),
        (False, True, True, False, None),
        (False, True, False, False, {"code": "token_budget", "budget": 32}),
        (False, False, False, True, None),
    ]
    phases = [tl.add(i + 1, 10.0 * (i + 1), waiting=w, seated=s, admitted=a, finished=f,
                     wait=wait) for i, (w, s, a, f, wait) in enumerate(steps)]
    assert phases == ["queued", "queued", "prefill", "prefill", "decode", "preempted",
                      "queued", "prefill", "decode", "decode"]
    got = tl.to_list()
    assert [(s["phase"], s["from_step"], s["to_step"], s["steps"]) for s in got] == [
        ("queued", 1, 2, 2), ("prefill", 3, 4, 2), ("decode", 5, 5, 1), ("preempted", 6, 6, 1),
        ("queued", 7, 7, 1), ("prefill", 8, 8, 1), ("decode", 9, 10, 2)]
    assert [(s["start_ms"], s["end_ms"]) for s in got][:2] == [(0.0, 20.0), (20.0, 40.0)]
    assert [r["code"] for r in got[0]["reasons"]] == ["seats_full", "queued_behind"]
    assert got[0]["reasons"][1]["fields"] == {"position": 1, "head_code": "seats_full"}
    assert got[3]["reasons"] == [{"code": "preempted", "steps": 1, "from_step": 6,
                                  "to_step": 6, "fields": {"rule": "recompute",
                                                           "redo_tokens": 13}}]
    assert got[6]["reasons"][0]["code"] == "token_budget" and got[-1]["end_ms"] == 100.0
    assert tl.codes() == ["seats_full", "queued_behind", "prefill_chunk", "preempted",
                          "kv_short", "token_budget"]
    assert tl.add(11, 110.0, waiting=False, seated=False, admitted=False, finished=False,
                  wait=None) is None  # a step it was not in


def test_the_overhead_bench_times_both_kinds_of_step(monkeypatch, tmp_path):
    """benchmarks/waits_bench.py at a tiny size: steps with the reasons carry a code for every
    waiting request, steps without carry none, and the JSON holds both medians (its figure is
    docs/performance.md's, at 256 running and 1,000 waiting)."""
    import json

    from benchmarks import waits_bench

    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")  # no re-exec of this process
    out = tmp_path / "w.json"
    r = waits_bench.main(["--running", "3", "--waiting", "5", "--steps", "1",
                          "--json", str(out)])
    assert r["step_ms_reasons_on"] > 0 and r["step_ms_reasons_off"] > 0
    assert r["reasons_pass_ms"] >= 0
    assert json.loads(out.read_text())["waiting"] == 5




def test_the_prefix_lookup_says_how_many_blocks_hit_and_why_the_first_miss_missed():
    alloc = PagedAllocator(8, 4, enable_prefix_caching=True)
    a = computed_prompt(alloc, "a", list(range(1, 14)))  # 13 tokens: 3 full blocks hashed
    assert a.prefix_lookup == {"hit_blocks": 0, "full_blocks": 3,
                               "miss": {"why": "new", "token": 0}}
    # the same first 5 tokens, then another: block 0 hits, block 1 differs at token 5
    b = Request("b", [1, 2, 3, 4, 5, 99, 7, 8, 9, 10], SamplingParams(max_tokens=1))
    alloc.admit(b)
    assert b.prefix_lookup == {"hit_blocks": 1, "full_blocks": 2,
                               "miss": {"why": "differs", "token": 5}}
    # all of a's full blocks and a tail shorter than a block
    c = Request("c", list(range(1, 14)) + [50], SamplingParams(max_tokens=1))
    alloc.admit(c)
    assert c.prefix_lookup == {"hit_blocks": 3, "full_blocks": 3,
                               "miss": {"why": "short", "token": 12, "left": 2}}
    # a prompt shorter than one block cannot hit at all
    d = Request("d", [1, 2, 3], SamplingParams(max_tokens=1))
    alloc.admit(d)
    assert d.prefix_lookup["miss"] == {"why": "short", "token": 0, "left": 3}


def test_the_prefix_lookup_tells_an_evicted_block_from_a_new_one():
    alloc = PagedAllocator(4, 4, enable_prefix_caching=True)
    a = computed_prompt(alloc, "a", list(range(1, 10)))  # 3 blocks, 2 of them full and cached
    alloc.free(a)
    other = computed_prompt(alloc, "x", list(range(100, 116)))  # takes all 4: a's are evicted
    alloc.free(other)
    again = Request("a2", list(range(1, 10)), SamplingParams(max_tokens=1))
    alloc.admit(again)
    assert again.prefix_lookup["miss"] == {"why": "evicted", "token": 0}
    assert again.prefix_lookup["hit_blocks"] == 0


def test_an_engines_report_explains_each_admitted_requests_lookup(monkeypatch):
    from engine import EngineConfig, LLMEngine
    from engine import SamplingParams as SP

    eng = LLMEngine(EngineConfig(dtype="float32", max_num_seqs=2, enable_prefix_caching=True,
                                 block_size=16))
    shared = "You are a helpful assistant. Answer briefly and clearly, please. " * 3
    eng.add_request(shared + "What is the sea, with its waves and tides and the deep blue "
                    "water far from any land?", SP(max_tokens=2, ignore_eos=True))
    first = eng.step().to_dict()
    assert list(first["prefix"].values())[0]["miss"]["why"] == "new"
    eng.add_request(shared + "What is a ship, with its sails and masts and its crew of many "
                    "sailors at sea?", SP(max_tokens=2, ignore_eos=True))
    second = eng.step().to_dict()
    (lookup,) = second["prefix"].values()
    assert lookup["hit_blocks"] >= 2 and lookup["miss"]["why"] == "differs"
    # the paging page's line, in both languages
    from app.components.kvmap import prefix_line

    (rid,) = second["prefix"]
    with monkeypatch.context() as m:
        m.setattr("app.i18n.get_lang", lambda: "en")
        assert prefix_line(rid, lookup) == (
            f"{rid}'s prefix cache: {lookup['hit_blocks']} of its {lookup['full_blocks']} full "
            f"prompt blocks hit; the cached block differs from it at token "
            f"{lookup['miss']['token']}")
        m.setattr("app.i18n.get_lang", lambda: "zh")
        assert f"缓存里的块在第 {lookup['miss']['token']} 个 token 处与它不同" in \
            prefix_line(rid, lookup)
    while eng.has_unfinished():
        eng.step()
