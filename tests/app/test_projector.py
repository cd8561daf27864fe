"""The class plan on a projector: chromium at 1280x720, in English and in Chinese. After "Set
up this stop", the stop's prediction and the control that runs it (Lock, then Play beside
the prediction; "Start the race" on the home page) are inside the viewport without
scrolling, and so is the top of the page's picture (seats, KV maps, gauges); the plan reads
its stops in order, left to right, top to bottom; after a few steps of Play no metric value
or label is cut off and no KV block's number leaves its cell. Screenshots (as the projector
shows the page) go to build/screenshots/projector-*.png (gitignored).
"""

from __future__ import annotations

import contextlib
import os
import re

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from app.classplan import STOPS
from app.i18n import STRINGS
from app.pagelist import page_info
from tests.browsing import Tab

pytestmark = [pytest.mark.browser, pytest.mark.slow]

W, H = 1280, 720
# each stop's page's picture, which must show (at least PICTURE_PX of it) below the prediction
# without scrolling: the race, the seats, the KV maps, the speculation gauges, the dashboard
PICTURE = {"home": ".st-key-race_start", "batching": ".sl-car", "paging": ".sl-kv",
           "speculation": '[data-testid="stMetric"]', "dashboard": '[data-testid="stMetric"]'}
PICTURE_PX = 120
SCROLL_MS = 6000  # the page's own scroll into view (its last at 3 s), with room for a busy CPU
LOCALES = {"en": "English", "zh": "中文"}

# every metric's value and label fits its box (no "33.8 to…", no "吞…"), and every KV block's
# number fits its own cell (none runs into the next block's)
CUT_JS = """() => [...[...document.querySelectorAll(
    '[data-testid="stMetricValue"] div, [data-testid="stMetricLabel"] p')]
  .filter(e => e.offsetParent && e.scrollWidth > e.clientWidth + 1)
  .map(e => e.innerText),
  ...[...document.querySelectorAll('.sl-b span')]
  .filter(e => e.getBoundingClientRect().right > e.parentElement.getBoundingClientRect().right + 1)
  .map(e => 'KV block ' + e.innerText)]"""


# the step counter of a live page ("Step N", "第 N 步"), -1 before it is drawn
STEP_JS = r"""() => {
  for (const h of document.querySelectorAll('h3')) {
    const m = /^(?:Step (\d+)|第 (\d+) 步)$/.exec(h.innerText.trim());
    if (m) return Number(m[1] ?? m[2]);
  }
  return -1;
}"""
# the stop's reveal is drawn (the run ended by itself: the reveal took Play's place)
REVEALED_JS = "id => !!document.querySelector(`.st-key-pred_${id} [data-testid=stAlert]`)"
# Play has run `n` steps, or the run ended. Not "Play's button is gone": the button leaves the
# page for a moment during the rerun Play's click starts, and a Pause judged then is never sent
PLAYED_JS = ("([id, n]) => (" + STEP_JS + ")() >= n || (" + REVEALED_JS + ")(id)")
PLAY_STEPS = 2
PAUSE_TRIES, PAUSE_WAIT_MS = 3, 20_000
PAUSE_LABELS = [STRINGS["side.pause"][lang] for lang in ("zh", "en")]
# the run is paused (its button reads Play again) or ended (the reveal took its place)
PAUSED_JS = """([id, pause]) => { const b = document.querySelector('.st-key-pred_play button');
  return b ? !pause.includes(b.innerText.trim())
           : !!document.querySelector(`.st-key-pred_${id} [data-testid=stAlert]`); }"""
# Pause, found and clicked in one step in the page (the run may end at any moment): "paused",
# or "revealed" when the reveal has taken its place; null (wait on) while neither is drawn
PAUSE_JS = """id => { const b = document.querySelector('.st-key-pred_play button');
  if (b) { b.click(); return "paused"; }
  return document.querySelector(`.st-key-pred_${id} [data-testid=stAlert]`) ? "revealed" : null;
}"""


def in_view(tab: Tab, selector: str) -> tuple[float, float]:
    box = tab.page.locator(selector).first.bounding_box()
    assert box is not None, f"{selector} is not drawn"
    return box["y"], box["y"] + box["height"]


def set_language(tab: Tab, lang: str) -> None:
    if lang == "zh":
        since = tab.runs()
        tab.page.locator('[data-testid="stSidebar"] label:has-text("中文")').first.click()
        tab.settle(since)


# The failure message lists every stop that misses, not only the first: a prediction or run
# control off screen, a cut value or label, an exception box. Chinese only in `make test` (the
# class's language; the longer strings): SERVELAB_PROJECTOR_LANGS=en,zh checks English too.
# The stops in two halves, each its own xdist group (tests/conftest.py), so the two workers can
# share the longest browser test; each half opens the plan and sets the language itself.
PARTS = 2


@pytest.mark.parametrize("part", [pytest.param(p, marks=pytest.mark.xdist_group(f"projector-{p}"))
                                  for p in range(PARTS)])
@pytest.mark.parametrize("lang", os.environ.get("SERVELAB_PROJECTOR_LANGS", "zh").split(","))
def test_each_stops_prediction_and_run_control_are_on_screen(chromium, app_url, lang, part):
    with Tab(chromium, app_url, W, H) as tab:
        tab.open("/plan")
        set_language(tab, lang)
        if part == 0:  # the plan reads in order: each stop's button below, or right of, the last
            boxes = [tab.page.locator(f".st-key-plan_stop_{s.id}").first.bounding_box()
                     for s in STOPS]
            order = sorted(range(len(STOPS)),
                           key=lambda i: (round(boxes[i]["y"]), boxes[i]["x"]))
            assert order == list(range(len(STOPS))), "the plan's stops read out of order"
        problems = []  # every stop is checked; the failure lists them all
        predicted = [n for n, stop in enumerate(STOPS, start=1) if stop.prediction is not None]
        mine = predicted[part::PARTS]  # 1, 3, 5, 7 / 2, 4, 6, 8: both halves meet every page
        for n, stop in enumerate(STOPS, start=1):
            if n not in mine:
                continue
            tab.click_nav("plan")
            tab.page.locator(f".st-key-plan_{stop.id} button").click()
            slug = page_info(stop.page).slug
            tab.page.wait_for_url(re.compile(rf"/{slug}(\?.*)?$"))
            # the full idle window: the page scrolls the prediction into view a while after
            # it is drawn (app/predict.py), which the checks below measure
            tab.settle()
            where = f"stop {n} ({stop.id}, {lang})"
            top, bottom = in_view(tab, f".st-key-pred_{stop.id}")
            if top < 0 or bottom > H:
                problems.append(f"{where}: the prediction at {top:.0f}-{bottom:.0f}")
            top, bottom = in_view(tab, f".st-key-pred_{stop.id}_lock button")
            if bottom > H:
                problems.append(f"{where}: the lock button at {top:.0f}-{bottom:.0f}")
            if stop.page == "home":
                top, bottom = in_view(tab, ".st-key-race_start button")
                if bottom > H:
                    problems.append(f"{where}: 'Start the race' at {top:.0f}-{bottom:.0f}")
            else:
                since = tab.runs()
                tab.page.locator(f".st-key-pred_{stop.id}_choice label").nth(1).click()
                tab.page.locator(f".st-key-pred_{stop.id}_lock button").click()
                tab.settle(since)
                top, bottom = in_view(tab, ".st-key-pred_play button")
                if bottom > H:
                    problems.append(f"{where}: Play at {top:.0f}-{bottom:.0f}")
                # a few steps, so the gauges and the KV map hold numbers, then Pause
                start = tab.page.evaluate(STEP_JS)
                tab.page.locator(".st-key-pred_play button").click()
                tab.page.wait_for_function(PLAYED_JS, arg=[stop.id, start + PLAY_STEPS])
                # Pause; a click Streamlit takes only after the running fragment's turn (a busy
                # CPU) is given PAUSE_WAIT_MS to show, and clicked again, as a teacher would
                for _attempt in range(PAUSE_TRIES):
                    since = tab.runs()
                    paused = tab.page.wait_for_function(PAUSE_JS, arg=stop.id).json_value()
                    if paused != "paused":
                        break
                    with contextlib.suppress(PlaywrightTimeout):
                        tab.page.wait_for_function(PAUSED_JS, arg=[stop.id, PAUSE_LABELS],
                                                   timeout=PAUSE_WAIT_MS, polling=100)
                        break
                else:
                    problems.append(f"{where}: {PAUSE_TRIES} clicks of Pause left it playing")
                try:
                    tab.settle(since if paused == "paused" else None)
                except AssertionError as exc:
                    raise AssertionError(f"{where}: {exc}") from None
            # the page scrolls the prediction to the top up to 3 s after it draws (each run,
            # app/predict.py): give that scroll its time before judging the fold
            with contextlib.suppress(PlaywrightTimeout):
                tab.page.wait_for_function(
                    "([sel, limit]) => { const e = document.querySelector(sel);"
                    " return e && e.getBoundingClientRect().top <= limit; }",
                    arg=[PICTURE[stop.page], H - PICTURE_PX], timeout=SCROLL_MS, polling=100)
            top, _ = in_view(tab, PICTURE[stop.page])
            if top > H - PICTURE_PX:
                problems.append(f"{where}: the page's picture starts at {top:.0f}, below the fold")
            tab.screenshot(f"projector-{lang}-{n}-{stop.id}", top=False)
            cut = tab.page.evaluate(CUT_JS)
            if cut:
                problems.append(f"{where}: cut off: {cut}")
            if tab.exceptions():
                problems.append(f"{where}: an exception box")
        assert problems == [], "\n".join(problems)
        assert tab.errors == [], tab.errors
