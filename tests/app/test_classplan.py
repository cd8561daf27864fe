"""The class plan (app/classplan.py): its stops, their knobs, and predictions measured from
real StepReports (no model, no browser; the AppTest checks are in test_pages.py)."""

from __future__ import annotations

import copy
import json
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from app import classplan  # noqa: E402
from app.classplan import KNOBS, STOPS, SUMMARY, Prediction, Stop, stop_by_id  # noqa: E402
from app.lessons import Text  # noqa: E402
from app.state import Settings  # noqa: E402

REPORTS = json.loads((ROOT / "tests/app/fixtures/reports.json").read_text(encoding="utf-8"))


def test_the_class_fits_45_minutes_with_slack():
    assert 7 <= len(STOPS) <= 10
    assert 38 <= sum(s.minutes for s in STOPS) <= 41, "about 40 minutes of stops, the rest slack"
    assert len({s.id for s in STOPS}) == len(STOPS)
    assert sum(s.prediction is not None for s in STOPS) >= len(STOPS) - 1


@pytest.mark.parametrize("stop", STOPS, ids=lambda s: s.id)
def test_every_stop_names_every_knob_and_builds_its_settings(stop):
    assert set(stop.knobs) == set(KNOBS)
    assert "model" not in KNOBS and {"batching", "kv_layout", "spec", "seats", "num_blocks",
                                      "block_size", "workload", "num_requests",
                                      "temperature", "k"} <= set(KNOBS)
    assert stop.settings == Settings(**stop.knobs)
    stop.settings.engine_config(256)  # the engine accepts the values


@pytest.mark.parametrize("stop", STOPS, ids=lambda s: s.id)
def test_every_stop_fits_the_sidebars_controls(stop):
    """"Set up this stop" writes the knobs into the sidebar's widgets: each must be a value
    the widget offers (app/sidebar.py), or the page would refuse it."""
    from app.state import MAX_REQUESTS
    from benchmarks.workloads import WORKLOAD_NAMES

    k = stop.knobs
    assert 1 <= k["seats"] <= 16 and 1 <= k["k"] <= 8
    assert 16 <= k["num_blocks"] <= 256 and k["num_blocks"] % 8 == 0
    assert k["block_size"] in (8, 16, 32) and 1 <= k["num_requests"] <= MAX_REQUESTS
    assert k["workload"] in WORKLOAD_NAMES and 0.0 <= k["temperature"] <= 1.5


def test_a_stop_missing_a_knob_or_naming_an_unknown_page_is_refused():
    base = dict(STOPS[1].knobs)
    del base["seats"]
    with pytest.raises(ValueError, match="missing \\['seats'\\]"):
        Stop("x", 5, "batching", Text("甲", "a"), Text("乙", "b"), base)
    with pytest.raises(ValueError, match="unknown page"):
        Stop("x", 5, "nowhere", Text("甲", "a"), Text("乙", "b"), STOPS[1].knobs)
    with pytest.raises(ValueError, match="unknown knobs"):
        classplan._knobs(colour="red")
    with pytest.raises(ValueError, match="unknown stop"):
        stop_by_id("nope")


def test_choices_are_ranges_and_the_measurement_picks_one():
    p = Prediction(Text("甲", "q"), (Text("一", "a"), Text("二", "b"), Text("三", "c")),
                   (1.0, 2.0), lambda runs, extra: extra.get("v"))
    assert p.reveal([], {}) is None
    assert [p.reveal([], {"v": v})[1] for v in (0.5, 1.0, 1.9, 2.0, 9.0)] == [0, 1, 1, 2, 2]
    with pytest.raises(ValueError, match="increasing bound"):
        Prediction(Text("甲", "q"), p.choices, (2.0, 1.0), p.measure)


def view(name: str, done: bool = True, **settings) -> tuple:
    return (Settings(**settings), copy.deepcopy(REPORTS[name]), done)


def test_measurements_come_from_the_reports():
    static = view("static_contiguous", batching="static", kv_layout="contiguous")
    paged = view("continuous_paged_prefix", batching="continuous", kv_layout="paged")
    waste = classplan.static_waste([static, paged], {})
    hist = static[1]
    seat_steps = sum(len(r["seats"]) for r in hist)
    held = sum(s["state"] == "idle-finished" for r in hist for s in r["seats"])
    assert waste == pytest.approx(held / seat_steps) and held > 0
    assert classplan.steps_ratio([static, paged], {}) == pytest.approx(
        len(paged[1]) / len(hist))
    peak = [max(len(r["kv"]["block_tables"]) for r in v[1]) for v in (paged, static)]
    assert classplan.concurrency_ratio([static, paged], {}) == pytest.approx(peak[0] / peak[1])
    assert 0 < classplan.contiguous_useful([static, paged], {}) < 1
    spec = view("spec_ngram", spec="ngram")
    assert classplan.tokens_per_pass([spec], {}) >= 1
    not_done = view("static_contiguous", done=False, batching="static")
    assert classplan.static_waste([not_done, paged], {}) is None, "no reveal before the end"
    assert classplan.race_ratio([], {"race": {"ratio": 3.5}}) == 3.5
    assert classplan.race_ratio([], {"race": None}) is None


def test_every_prediction_states_its_chapter_range_in_both_languages():
    for stop in STOPS:
        pred = stop.prediction
        if pred is None:
            continue
        lo, hi = pred.expect
        assert not (lo == float("-inf") and hi == float("inf")), f"{stop.id}: no range"
        assert pred.why and pred.why.zh and pred.why.en, stop.id
        assert pred.expect_text("en") and pred.expected(lo if lo > -1e9 else hi)
    with pytest.raises(ValueError, match="low < high"):
        Prediction(Text("甲", "q"), (Text("一", "a"), Text("二", "b")), (1.0,),
                   lambda runs, extra: None, expect=(2.0, 1.0))


def test_the_waste_detail_sets_the_papers_ratio_beside_ours():
    cont = view("static_contiguous", batching="static", kv_layout="contiguous")
    paged = view("continuous_paged_prefix", batching="continuous", kv_layout="paged")
    text = classplan.waste_detail([cont, paged], {})
    from lessons.figures import figure_text  # the paper's figure, read from lessons/figures.json

    assert figure_text("paper_useful_kv", "en") in text.en
    assert figure_text("paper_useful_kv", "zh") in text.zh
    ours = classplan.contiguous_useful([cont, paged], {})
    assert f"{ours:.0%}" in text.en and f"{ours:.0%}" in text.zh
    assert classplan.waste_detail([view("static_contiguous", done=False,
                                        kv_layout="contiguous"), paged], {}) is None


def test_summary_points_link_to_existing_stops():
    ids = {s.id for s in STOPS}
    assert len(SUMMARY) == 6
    for point, stops in SUMMARY:
        assert point.zh and point.en and stops and set(stops) <= ids
