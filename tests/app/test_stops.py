"""Every class-plan stop shows what it teaches: its preset, run headless on this CPU through
the code its page uses (the page's runs, stepped together, then the stop's own measurement),
lands in the range the chapter argues for (`Prediction.expect`, shown to the teacher).

Greedy decoding and the presets' fixed seeds make the work identical on every run; what
varies is the CPU's timing, which only the timed stops read (the race's speed ratio, the TPOT
ratios of stops 7 and 8). Where those land depends on the CPU and on what else runs beside
them (make test runs two workers), so they are measurements: make test runs each timed stop
and checks it measures a ratio; make test-soak, one test at a time, checks its range.
"""

from __future__ import annotations

import math
import os
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as app/main.py: a shared 2-core CPU

from app.classplan import (  # noqa: E402
    PLAY_TICKS,
    RUN_STEPS_SLACK,
    STOPS,
    measure_headless,
    page_variants,
    race_ratio,
    run_headless,
    tpot_ratio,
)

pytestmark = pytest.mark.slow

MEASURED = [s for s in STOPS if s.prediction is not None]


def race(settings):
    from app.race import RACE_MAX_TOKENS, RACE_REQUESTS
    from app.race import race as run_race

    return run_race(settings.seats, settings.model, RACE_REQUESTS, RACE_MAX_TOKENS)


TIMED = (race_ratio, tpot_ratio)  # the measures that read the clock


# a timed stop's range is checked by make test-soak (the race also by `python -m
# benchmarks.bench`); every other stop's range here
@pytest.mark.parametrize("stop", [pytest.param(s, marks=pytest.mark.soak)
                                  if s.prediction.measure in TIMED else s for s in MEASURED],
                         ids=lambda s: s.id)
def test_the_stop_lands_in_its_chapter_range(stop):
    pred = stop.prediction
    if stop.page == "home":
        value = measure_headless(stop, race=race)
    else:  # and the run's length is the one its progress bar and its stride are set by
        views, steps = run_headless(stop)
        value = pred.measure(views, {})
        assert stop.run_steps is not None, f"{stop.id}: its run length is not in RUN_STEPS"
        assert abs(steps - stop.run_steps) <= RUN_STEPS_SLACK * stop.run_steps, (
            f"stop {stop.id}: ran {steps} steps, RUN_STEPS says {stop.run_steps}")
        # Play ends it within its minute: at most PLAY_TICKS ticks of `stride` steps
        assert math.ceil(steps / stop.stride) <= PLAY_TICKS * (1 + RUN_STEPS_SLACK), stop.id
    assert value is not None and math.isfinite(value), f"{stop.id}: nothing measured"
    lo, hi = pred.expect
    assert pred.expected(value), (
        f"stop {stop.id}: measured {pred.value_fmt.format(value)}, chapter range "
        f"{pred.expect_text('en')} ({lo}, {hi})")


@pytest.mark.parametrize("stop", [s for s in MEASURED if s.prediction.measure is tpot_ratio],
                         ids=lambda s: s.id)
def test_a_tpot_stop_runs_both_sides_and_measures_a_ratio(stop):
    value = measure_headless(stop, race=race)
    assert value is not None and math.isfinite(value) and value > 0, f"{stop.id}: {value}"


def test_the_headless_runs_are_the_pages_runs():
    """A stop's measurement compares exactly the variants its page draws side by side."""
    hall = next(s for s in STOPS if s.id == "hall")
    assert [v.kv_layout for v in page_variants("paging", hall.settings)] == ["contiguous",
                                                                           "paged"]
    quiet = next(s for s in STOPS if s.id == "quiet")
    assert [v.spec for v in page_variants("dashboard", quiet.settings)] == ["ngram", "off"]


def test_stop_4_and_5_reserve_what_is_never_written():
    """The paging stops run a workload whose answers end at EOS below their max_tokens: the
    contiguous reservation (prompt + max_tokens) is then mostly never written."""
    from app.state import Session

    for stop_id in ("hall", "waste"):
        stop = next(s for s in STOPS if s.id == stop_id)
        jobs = Session(settings=stop.settings).jobs()
        assert jobs and not any(j.ignore_eos for j in jobs), stop_id
        assert min(j.max_tokens for j in jobs) >= 200, stop_id
