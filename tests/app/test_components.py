"""The app's pure components on real StepReports recorded from the engine (no model, no browser).

tests/app/fixtures/reports.json comes from tests/app/record_reports.py: static + contiguous,
continuous + paged with prefix sharing, and n-gram and draft speculation at temperature 1.
"""

from __future__ import annotations

import copy
import json
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from app.components import charts, gauges, kvmap, palette, seats, spec_strip  # noqa: E402
from app.spec_lab import bench_command, load_bench, recorded_date, speedup_rows  # noqa: E402
from app.state import MAX_TOKENS, Settings, model_len_for, preset_jobs  # noqa: E402

REPORTS = json.loads((ROOT / "tests/app/fixtures/reports.json").read_text(encoding="utf-8"))
EVIL = "<script>alert(1)</script>"


@pytest.fixture(autouse=True)
def english(monkeypatch):
    monkeypatch.setattr("app.i18n.get_lang", lambda: "en")


def run(name: str) -> list[dict]:
    return copy.deepcopy(REPORTS[name])


def with_evil_request(report: dict) -> dict:
    """The report with its first seated request renamed to a script tag everywhere."""
    rep = copy.deepcopy(report)
    rid = next(s["request_id"] for s in rep["seats"] if s["request_id"])
    text = json.dumps(rep).replace(f'"{rid}"', json.dumps(EVIL))
    return json.loads(text)


# ---------------------------------------------------------------- palette


def test_request_colours_are_stable_and_distinct():
    assert palette.request_color("r3") == palette.request_color("r3")
    assert len({palette.request_color(f"r{i}") for i in range(12)}) == 12
    assert palette.request_color(None) == "#ffffff"
    assert palette.text_color("#ffffff") == "#000000"
    assert palette.text_color("#1f77b4") == "#ffffff"


# ---------------------------------------------------------------- seats


def test_static_run_has_idle_finished_seats_and_a_queue():
    history = run("static_contiguous")
    states = {s["state"] for rep in history for s in rep["seats"]}
    assert "idle-finished" in states, "static batching should keep finished riders seated"
    use = seats.seat_use(history)
    assert use["idle-finished"] > 0 and use["busy_frac"] < 1
    rep = next(r for r in history if r["waiting"])
    out = seats.queue_html(rep)
    for rid in rep["waiting"]:
        assert f">{rid}</span>" in out


def test_seats_html_draws_every_seat_with_its_rider_and_state():
    history = run("static_contiguous")
    rep = next(r for r in history if any(s["state"] == "idle-finished" for s in r["seats"]))
    out = seats.seats_html(rep)
    assert out.count('class="sl-seat ') == len(rep["seats"])
    assert "sl-seat idle-finished" in out and "done, seat held" in out
    for s in rep["seats"]:
        if s["request_id"]:
            assert f">{s['request_id']}</span>" in out
            assert f"{s['num_output_tokens']} tok out" in out


def test_seat_views_escape_request_ids_and_engine_messages():
    rep = with_evil_request(run("static_contiguous")[0])
    rep["waiting"] = [EVIL]
    rep["blocked_reason"] = EVIL
    out = seats.seats_html(rep) + seats.queue_html(rep)
    assert EVIL not in out
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in out


def test_timeline_frame_has_a_row_per_seat_per_step_and_the_chart_builds():
    history = run("continuous_paged_prefix")
    df = seats.timeline_frame(history)
    assert len(df) == sum(len(r["seats"]) for r in history)
    assert set(df["state"]) <= set(seats.SEAT_STATES)
    spec = seats.timeline_chart(history, "t").to_dict()
    assert spec["mark"]["type"] == "rect"
    assert "done, seat held" in spec["encoding"]["color"]["scale"]["domain"]


def test_continuous_batching_never_holds_a_finished_rider():
    for name in ("continuous_paged_prefix", "spec_ngram"):
        assert seats.seat_use(run(name))["idle-finished"] == 0


# ---------------------------------------------------------------- KV map


def test_kv_grid_draws_every_block_and_hatches_reserved_contiguous_blocks():
    kv = run("static_contiguous")[2]["kv"]
    out = kvmap.kv_grid_html(kv)
    assert out.count('class="sl-b ') == kv["num_blocks"]
    reserved = sum(1 for b in kv["blocks"] if b["state"] == "reserved")
    assert reserved > 0 and out.count("sl-b reserved") == reserved
    assert out.count("repeating-linear-gradient") >= reserved


def test_kv_grid_marks_shared_prefix_blocks_and_the_selected_request():
    history = run("continuous_paged_prefix")
    rep = next(r for r in history if any(b["state"] == "shared" for b in r["kv"]["blocks"]))
    kv = rep["kv"]
    shared = [b for b in kv["blocks"] if b["state"] == "shared"]
    out = kvmap.kv_grid_html(kv, selected=shared[0]["owners"][0])
    assert out.count("sl-b shared") == len(shared)
    assert f"<b>×{len(shared[0]['owners'])}</b>" in out
    selected = len(kv["block_tables"][shared[0]["owners"][0]])
    assert out.count(" sel\"") == selected
    assert kvmap.kv_stats(kv)["shared_blocks"] == len(shared)


def test_page_table_follows_the_block_table():
    kv = run("continuous_paged_prefix")[-3]["kv"]
    rid, table = next(iter(kv["block_tables"].items()))
    df = kvmap.page_table(kv, rid)
    assert list(df["logical block"]) == list(range(len(table)))
    assert list(df["physical block"]) == table
    assert kvmap.page_table(kv, "nobody").empty


def test_kv_stats_are_the_engine_totals():
    kv = run("static_contiguous")[3]["kv"]
    s = kvmap.kv_stats(kv)
    assert s["used"] + s["waste"] == s["allocated"]
    assert s["largest_free_run"] == kv["largest_free_run"] * kv["block_size"]
    assert s["useful_frac"] == pytest.approx(kv["used_slots"] / kv["allocated_slots"])
    assert s["requests"] == len(kv["block_tables"])


def test_a_wait_on_external_fragmentation_is_told_apart():
    rep = run("static_contiguous")[0]
    rep["waiting"] = ["r9"]
    rep["blocked_reason"] = "external fragmentation: 12 blocks free, largest run 5, needs 8"
    assert kvmap.waits_on_fragmentation(rep)
    rep["blocked_reason"] = "seats"
    assert not kvmap.waits_on_fragmentation(rep)
    rep["waiting"], rep["blocked_reason"] = [], "external fragmentation: ..."
    assert not kvmap.waits_on_fragmentation(rep), "nobody waits"


def test_kv_grid_escapes_owner_names():
    rep = with_evil_request(run("static_contiguous")[2])
    out = kvmap.kv_grid_html(rep["kv"], selected=EVIL)
    assert EVIL not in out and "&lt;script&gt;" in out
    assert " sel\"" in out


def test_legend_names_every_block_state():
    out = kvmap.legend_html()
    for label in ("full block", "reserved, unused", "free", "shared", "cached", "copied on write"):
        assert label in out


def test_forked_samples_share_the_prompt_then_copy_on_write():
    """n = 2 over paged KV, from a real engine run: after the fork both samples' page tables
    point at the prompt's blocks (reference count 2); the step a sample first writes into the
    shared partial block, the engine copies it, and the map frames the copy with its source."""
    history = run("paged_n2")
    forked = [r for r in history if kvmap.forked_groups(r["kv"])]
    assert forked, "the recorded run has forked samples"
    kv0 = forked[0]["kv"]
    group, ids = next(iter(kvmap.forked_groups(kv0).items()))
    assert ids == [f"{group}#0", f"{group}#1"]
    shared = [b for b in kv0["blocks"] if set(ids) <= set(b["owners"])]
    assert shared and all(b["state"] == "shared" for b in shared)
    # the engine's own tables agree: the shared blocks are in both samples' tables
    assert {b["block"] for b in shared} <= set(kv0["block_tables"][ids[0]]) & set(
        kv0["block_tables"][ids[1]])
    out = kvmap.kv_grid_html(kv0)
    assert out.count("<b>×2</b>") >= len(shared)
    line = kvmap.fork_lines(kv0)[0]
    assert group in line and f"#{shared[0]['block']}×2" in line

    # the copy: a step whose report lists (source, destination) blocks
    i, rep = next((i, r) for i, r in enumerate(history) if r["kv"]["copies"])
    kv, before = rep["kv"], history[i - 1]["kv"]
    groups = kvmap.forked_groups(kv)
    for src, dst in kv["copies"]:
        # the source was shared by a request's samples the step before; now one of them holds
        # the copy at the same logical place in its table, and its sibling kept the source
        group, ids = next((g, s) for g, s in groups.items()
                          if any(dst in kv["block_tables"][r] for r in s))
        assert set(ids) <= {o for b in before["blocks"] if b["block"] == src
                            for o in b["owners"]}
        holder = next(r for r in ids if dst in kv["block_tables"][r])
        other = next(r for r in ids if r != holder)
        at = kv["block_tables"][holder].index(dst)
        assert before["block_tables"][holder][at] == src
        assert kv["block_tables"][other][at] == src
        assert kvmap.copied_into(kv)[dst] == src
        out = kvmap.kv_grid_html(kv)
        assert f'<i class="cow">⧉{src}</i>' in out
        assert f"copied on write from #{src} this step" in out
        line = next(x for x in kvmap.fork_lines(kv) if f"**{group}**" in x)
        assert f"#{src} → #{dst} ({holder})" in line
    assert kvmap.kv_grid_html(kv).count("sl-b used copied") == len(kv["copies"])
    # no copy in a step that made none: the frame is this step's event, not a history
    quiet = next(r for r in history[i + 1:] if not r["kv"]["copies"])
    assert "copied" not in kvmap.kv_grid_html(quiet["kv"]).split("</style>")[1]


def test_fork_lines_in_both_languages(monkeypatch):
    kv = next(r["kv"] for r in run("paged_n2") if r["kv"]["copies"])
    en = kvmap.fork_lines(kv)
    monkeypatch.setattr("app.i18n.get_lang", lambda: "zh")
    zh = kvmap.fork_lines(kv)
    assert en and zh and en != zh and "写时复制" in zh[0] and "Copied on write" in en[0]


# ---------------------------------------------------------------- speculation


def test_verdicts_cover_accepted_rejected_and_discarded():
    tokens = [t for rep in run("spec_ngram") for rec in rep["spec"] for t in rec["drafted"]]
    verdicts = {spec_strip.verdict(t) for t in tokens}
    assert verdicts == {"accepted", "rejected", "discarded"}


def test_strips_colour_each_drafted_token_by_verdict_and_show_the_target_token():
    history = run("spec_ngram")
    rid = spec_strip.spec_requests(history)[0]
    records = spec_strip.records_for(history, rid)
    out = spec_strip.strips_html(history, rid)
    assert out.count('class="sl-strip"') == len(records)
    drafted = sum(len(rec["drafted"]) for _, rec in records)
    assert out.count('class="sl-tok"') == drafted + len(records)
    assert spec_strip.SPEC_COLORS["rejected"] in out
    assert "correction" in out


def test_draft_model_records_carry_p_draft_and_the_bonus():
    history = run("spec_draft")
    tokens = spec_strip.drafted_tokens(history, "r0")
    assert tokens and all(t["p_draft"] is not None for t in tokens)
    assert any(rec["next_kind"] == "bonus" for rep in history for rec in rep["spec"])


@pytest.mark.parametrize("name", ["spec_ngram", "spec_draft"])
def test_accept_math_matches_the_engines_accept_probability(name):
    history = run(name)
    checked = [t for rid in spec_strip.spec_requests(history)
               for t in spec_strip.drafted_tokens(history, rid) if t["accept_prob"] is not None]
    assert checked
    for tok in checked:
        m = spec_strip.accept_math(tok)
        assert m["min_ratio"] == pytest.approx(min(1.0, tok["p_target"] / tok["p_draft"]))
        assert m["min_ratio"] == pytest.approx(tok["accept_prob"], abs=1e-5)


def test_spec_summary_counts_drafts_and_passes():
    history = run("spec_ngram")
    s = spec_strip.spec_summary(history)
    records = [rec for rep in history for rec in rep["spec"]]
    assert s["verifies"] == len(records)
    assert s["drafted"] == sum(len(r["drafted"]) for r in records)
    assert s["tokens_per_pass"] == pytest.approx(1 + s["mean_accepted"])
    assert spec_strip.spec_summary([])["acceptance_rate"] is None


def test_two_acceptance_numbers_and_the_formula():
    history = run("spec_ngram")
    s = spec_strip.spec_summary(history)
    records = [rec for rep in history for rec in rep["spec"]]
    rejected = sum(rec["num_accepted"] < len(rec["drafted"]) for rec in records)
    assert s["examined"] == s["accepted"] + rejected
    assert s["a"] == pytest.approx(s["accepted"] / s["examined"])
    assert s["acceptance_rate"] < s["a"], "discarded drafts count only in accepted / drafted"
    assert s["predicted_tokens_per_pass"] == pytest.approx(
        sum(spec_strip.expected_tokens_per_pass(s["a"], len(r["drafted"])) for r in records)
        / len(records))
    assert spec_strip.expected_tokens_per_pass(0.8, 4) == pytest.approx(
        (1 - 0.8**5) / (1 - 0.8))
    assert spec_strip.expected_tokens_per_pass(1.0, 4) == 5
    assert spec_strip.expected_tokens_per_pass(0.0, 4) == 1
    with pytest.raises(ValueError, match="a must be in"):
        spec_strip.expected_tokens_per_pass(1.5, 4)


def test_byte_tokens_show_their_bytes_joined_to_the_character():
    encoder = {b: ch for ch, b in spec_strip._byte_decoder().items()}
    assert len(encoder) == 256
    raw = "猫".encode()  # e7 8c ab
    pieces = ["".join(encoder[b] for b in raw[:2]), encoder[raw[2]]]
    assert [spec_strip.piece_bytes(p) for p in pieces] == [raw[:2], raw[2:]]
    assert spec_strip.piece_bytes("<0xE7>") == b"\xe7"
    by_id = {11: raw[:2], 12: raw[2:], 13: b" cat"}
    rec = {"drafted": [{"token_id": 11, "text": "\ufffd", "accepted": True, "accept_prob": 1.0},
                       {"token_id": 12, "text": "\ufffd", "accepted": True, "accept_prob": 1.0}],
           "num_accepted": 2, "next_token_id": 13, "next_text": " cat", "next_kind": "bonus"}
    out = spec_strip.strip_html(1, rec, by_id)
    assert "⟨e7·8c⟩" in out and "⟨ab⟩=猫" in out and "▯" not in out
    assert "▯" in spec_strip.strip_html(1, rec), "without bytes: the replacement glyph"
    rec["drafted"][0]["accepted"] = False  # a rejected part does not join the kept text
    assert "=猫" not in spec_strip.strip_html(1, rec, by_id)


def test_model_text_in_strips_is_escaped_with_visible_whitespace():
    history = run("spec_ngram")
    rec = history[[i for i, r in enumerate(history) if r["spec"]][0]]["spec"][0]
    rec["drafted"][0]["text"] = EVIL + " x\n"
    rec["next_text"] = "<img src=x onerror=alert(1)>"
    out = spec_strip.strip_html(3, rec)
    assert EVIL not in out and "<img" not in out
    assert "&lt;script&gt;alert(1)&lt;/script&gt;␣x↵" in out
    assert "∅" == spec_strip.show_token("")
    assert spec_strip.show_token("\ufffd") == "▯", "a partial UTF-8 character"


# ---------------------------------------------------------------- gauges and charts


def test_gauges_have_every_value_and_acceptance_only_with_speculation():
    off = gauges.gauge_values(run("continuous_paged_prefix"))
    on = gauges.gauge_values(run("spec_ngram"))
    assert [g["key"] for g in off] == list(gauges.GAUGES)
    for key in ("acceptance", "tokens_per_pass"):
        assert {g["key"]: g["value"] for g in off}[key] == "—"
    assert {g["key"]: g["value"] for g in on}["acceptance"].endswith("%")
    per_pass = {g["key"]: g["raw"] for g in on}["tokens_per_pass"]
    assert per_pass == pytest.approx(spec_strip.spec_summary(run("spec_ngram"))["tokens_per_pass"])
    assert gauges.gauge_values([])[0]["value"] == "—"


def test_latencies_use_the_engine_clock():
    history = run("static_contiguous")
    df = gauges.history_frame(history)
    assert list(df["step"]) == [r["step"] for r in history]
    assert df["clock_s"].iloc[-1] == pytest.approx(sum(r["wall_s"] for r in history))
    first_token = next(i for i, r in enumerate(history) if r["emitted"])
    assert df["ttft"].iloc[-1] >= 1000 * history[first_token]["wall_s"] * 0.999
    assert (df["seats_busy"] <= 1).all() and (df["kv_used"] <= df["kv_allocated"]).all()


def fake_history(tokens_per_step: list[int], wall_s: float = 1.0) -> list[dict]:
    """One request emitting `tokens_per_step[i]` tokens at step i, each step `wall_s` long."""
    kv = {"used_slots": 1, "allocated_slots": 1, "total_slots": 8}
    seat = {"request_id": "r0", "state": "running"}
    reps = []
    for i, n in enumerate(tokens_per_step):
        last = i == len(tokens_per_step) - 1
        reps.append({"step": i + 1, "wall_s": wall_s, "waiting": [], "seats": [seat],
                     "emitted": [{"request_id": "r0", "token_ids": list(range(n))}],
                     "finished": ["r0"] if last else [], "spec": [], "metrics": {}, "kv": kv})
    return reps


def test_tpot_and_itl_part_ways_when_tokens_come_in_bursts():
    steady = gauges.history_frame(fake_history([1] * 7)).iloc[-1]
    assert steady["tpot"] == pytest.approx(1000) and steady["itl"] == pytest.approx(1000)
    bursts = gauges.history_frame(fake_history([1, 3, 3])).iloc[-1]  # 7 tokens in 3 steps
    assert bursts["tpot"] == pytest.approx(2000 / 6), "two steps for six tokens after the first"
    assert bursts["itl"] == pytest.approx(1000), "each delivery still comes one step later"


def test_summary_counts_every_emitted_token():
    history = run("spec_ngram")
    s = gauges.summary(history)
    assert s["tokens"] == sum(len(e["token_ids"]) for r in history for e in r["emitted"])
    assert s["tokens_per_s"] > 0 and s["steps"] == len(history)


def _marks(spec: dict) -> int:
    """How many marks a Vega-Lite spec draws (layers counted), so an empty chart fails."""
    layers = spec.get("layer") or [spec]
    return sum(1 for layer in layers if layer.get("mark"))


def _rows(spec: dict) -> int:
    return sum(len(v) for v in spec.get("datasets", {}).values())


def test_every_chart_builds():
    history = run("spec_ngram")
    for key in gauges.GAUGES:
        spec = charts.gauge_history_chart(history, key).to_dict()
        assert _marks(spec) >= 1 and _rows(spec) >= 1, key
    spec = charts.compare_chart({"a": history, "b": run("spec_draft")}, "tokens_per_s").to_dict()
    assert _rows(spec) >= 2
    assert _marks(charts.compare_chart({}, "seats_busy").to_dict()) >= 1
    spec = charts.forward_cost_chart([{"tokens": n, "ms": 10 + n} for n in (1, 2, 4)]).to_dict()
    assert _rows(spec) == 3
    spec = charts.speedup_chart([{"concurrency": c, "speedup": 2 / c, "method": "ngram"}
                                 for c in (1, 2, 4)]).to_dict()
    assert _rows(spec) >= 3
    spec = charts.race_chart([{"system": "naive", "tokens_per_s": 10.0},
                              {"system": "engine", "tokens_per_s": 25.0}]).to_dict()
    assert _rows(spec) >= 2
    import pandas as pd

    spec = charts.lossless_chart(pd.DataFrame([{"token": ".", "series": s, "value": 0.4}
                                               for s in ("a", "b", "c")])).to_dict()
    assert _rows(spec) == 3


# ---------------------------------------------------------------- state and bench files


def test_presets_are_capped_and_sized():
    jobs = preset_jobs("longtail")
    assert len(jobs) == 12 and max(j.max_tokens for j in jobs) <= MAX_TOKENS
    assert model_len_for(jobs, lambda p: [0] * 20) == 256
    assert model_len_for(jobs, lambda p: [0] * 300) == 384
    with pytest.raises(ValueError, match="unknown workload"):
        preset_jobs("nope")


def test_settings_map_onto_the_engine_config():
    cfg = Settings(batching="static", kv_layout="contiguous", spec="ngram", k=3,
                   prefix_caching=True).engine_config(256)
    assert (cfg.batching, cfg.kv_layout, cfg.spec.method, cfg.spec.num_speculative_tokens) == (
        "static", "contiguous", "ngram", 3)
    assert cfg.enable_prefix_caching is False, "prefix caching is for the paged layout only"
    assert Settings().engine_config(256).spec is None
    assert cfg.cuda_graphs is False, "the class's stepping gains nothing from CUDA graphs"


def test_a_session_keeps_only_the_most_recently_drawn_runs(monkeypatch):
    import app.state as state

    class FakeRun:
        def __init__(self, settings, jobs, max_model_len, progress=None):
            self.settings, self.ticks = settings, 0

        def advance(self):
            self.ticks += 1

    monkeypatch.setattr(state, "Run", FakeRun)
    monkeypatch.setattr(state.Session, "max_model_len", lambda self, s: 256)
    s = state.Session()
    s.step()
    variants = [s.settings.with_(seats=n) for n in (1, 2, 3, 4, 5)]
    for v in variants:
        assert s.run(v).ticks == 1, "a new run catches up with the clock"
    s.primary  # noqa: B018
    assert len(s.runs) == state.MAX_RUNS
    assert s.settings in s.runs and variants[-1] in s.runs and variants[0] not in s.runs


def test_bench_files_are_read_from_the_fixed_folder(tmp_path):
    assert load_bench(tmp_path / "missing") is None
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "engine.json").write_text(json.dumps({"results": [{"concurrency": 1}]}))
    (tmp_path / "spec.json").write_text(json.dumps({  # benchmarks/spec_bench.py's shape
        "args": {"k": 4, "max_tokens": 32, "quick": False, "json": "x.json", "threads": 0},
        "date": "2026-11-29",
        "results": [{"concurrency": 1, "spec": "ngram", "workload": "grounded",
                     "speedup_vs_off": 1.8},
                    {"concurrency": 1, "spec": None, "workload": "grounded",
                     "speedup_vs_off": 1.0}, {"x": 1}],
        "forward_cost": [{"tokens": 1, "ms": 5.0, "vs_one_token": 1.0}]}))
    import os

    os.utime(tmp_path / "engine.json")  # the newest file, but not the spec bench's
    # other spec runs: an older date and none at all, both with newer mtimes: not chosen
    older = {"date": "2026-11-02T10:00:00+00:00", "results": [],
             "forward_cost": [{"tokens": 1, "ms": 5.0, "vs_one_token": 1.0}]}
    (tmp_path / "spec-old.json").write_text(json.dumps(older))
    (tmp_path / "spec-undated.json").write_text(json.dumps({**older, "date": None}))
    bench = load_bench(tmp_path)
    assert bench["_file"] == "spec.json"
    (tmp_path / "spec-new.json").write_text(json.dumps({**older, "date": "2026-12-03T09:00:00+00:00"}))
    assert load_bench(tmp_path)["_file"] == "spec-new.json"
    assert recorded_date(load_bench(tmp_path)) == "2026-12-03"
    (tmp_path / "spec-new.json").unlink()
    assert bench_command(bench) == "python -m benchmarks.spec_bench --k 4 --max-tokens 32 " \
        "--json assets/bench/spec.json"  # the file read, wherever the run first wrote it
    assert bench_command({"args": {"json": "x.json"}}) == "python -m benchmarks.spec_bench " \
        "--json x.json"
    assert recorded_date(bench) == "2026-11-29"
    assert speedup_rows(bench["results"]) == [{"concurrency": 1, "speedup": 1.8,
                                               "method": "ngram · grounded"}]
    assert speedup_rows([{"concurrency": 4, "speedup": 0.9, "method": "draft"}])[0][
        "method"] == "draft"


# ---------------------------------------------------------------- the fixture's schema


def _field_names(cls) -> set[str]:
    import dataclasses

    return {f.name for f in dataclasses.fields(cls)}


def test_the_recorded_reports_have_the_step_reports_current_schema():
    """The component tests draw from recorded reports; when StepReport changes, this fails until
    tests/app/record_reports.py is run again, so no view is tested against a stale shape."""
    from engine.report import Emitted, KVSummary, Seat, StepReport
    from engine.spec.rejection import DraftToken, SpecDecision

    seen = {"report": False, "seat": False, "emitted": False, "spec": False}
    for name, history in REPORTS.items():
        for rep in history:
            assert set(rep) == _field_names(StepReport), (name, set(rep) ^ _field_names(StepReport))
            assert set(rep["kv"]) == _field_names(KVSummary), name
            for seat in rep["seats"]:
                assert set(seat) == _field_names(Seat), name
                seen["seat"] = True
            for em in rep["emitted"]:
                assert set(em) == _field_names(Emitted), name
                seen["emitted"] = True
            for dec in rep["spec"]:
                assert set(dec) == _field_names(SpecDecision), name
                for d in dec["drafted"]:
                    assert set(d) == _field_names(DraftToken), name
                seen["spec"] = True
            seen["report"] = True
    assert all(seen.values()), seen
