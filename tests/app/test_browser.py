"""The app in a real browser: `streamlit run app/main.py` driven by Debian's chromium (playwright).

Every page renders with no exception box and no console error at 1920x1080 and 1280x800; Step
and Play work by clicking; screenshots of the main pages go to build/screenshots/ (gitignored,
so `make test` leaves the work tree clean; `make screenshots` copies them to
assets/screenshots/, which the README shows). Install the browser with
`apt-get install chromium fonts-noto-cjk` (`playwright install` cannot download browsers here).
"""

from __future__ import annotations

import functools
import json
import pathlib
import re
import time

import pytest

from app.pagelist import LIVE_PAGES, OWN_ENGINE_PAGES, PAGE_TABLE, PAGES
from app.sidebar import PLAY_INTERVAL_S
from tests.browsing import SHOTS, Tab
from tests.conftest import ENGLISH_RUN

ROOT = pathlib.Path(__file__).resolve().parents[2]
VIEWPORTS = ((1920, 1080), (1280, 800))
PAUSED_INTERVALS = 3  # how many of Play's intervals a paused clock must stay still

pytestmark = [pytest.mark.browser, pytest.mark.slow]


# Text a Chinese page may show in English: Streamlit's own (its skip link and file uploader
# are not translated), and words quoted from data that is English by nature: the prompts the
# workloads send, the sources' citations, the glossary's English terms, the probe prompts.
FRAMEWORK_ENGLISH = ("Skip to main content", "Drag and drop file here", "Browse files",
                     "per file")
ENGLISH_DATA = (ROOT / "lessons" / "figures.json", ROOT / "lessons" / "glossary.json")
# text nodes to read: not icons (Material Symbols ligatures), code, styles or scripts
PAGE_TEXT_JS = """() => { const app = document.querySelector('[data-testid="stApp"]')
    .cloneNode(true);
  app.querySelectorAll('[data-testid="stIconMaterial"], code, pre, style, script')
    .forEach(e => e.remove());
  return app.textContent; }"""


CHAT_MARKUP = re.compile(r"<\|[a-z_]+\|>(?:user|assistant|system)?")


@functools.cache
def _english_corpus() -> str:
    import benchmarks.workloads as workloads

    texts: list[str] = []

    def walk(x) -> None:
        if isinstance(x, str):
            texts.append(x)
        elif isinstance(x, (list, tuple)):
            for y in x:
                walk(y)
        elif isinstance(x, dict):
            for y in x.values():
                walk(y)

    walk(list(vars(workloads).values()))
    walk([json.loads(p.read_text(encoding="utf-8")) for p in ENGLISH_DATA])
    return re.sub(r"\s+", " ", CHAT_MARKUP.sub(" ", " | ".join(texts)))


def english_on_page(page) -> list[str]:
    """Runs of three or more English words on the page, outside code, icons, Streamlit's
    own words and the data quoted as it is (workload prompts, citations, glossary terms)."""
    text = re.sub(r"\s+", " ", CHAT_MARKUP.sub(" ", page.evaluate(PAGE_TEXT_JS)))
    corpus = _english_corpus()
    return sorted({run for run in ENGLISH_RUN.findall(text)
                   if run not in corpus and not any(f in run for f in FRAMEWORK_ENGLISH)})


def test_every_page_renders_without_errors(chromium, app_url):
    """Each page is visited once and checked at both sizes: the app draws the same at any
    width (it reads none), so a resize re-lays out what a fresh load at that size would draw;
    on the live pages Step then runs the script again at the new size. In Chinese (a zh-CN
    browser, as the class's), and no page shows English words beyond code, Streamlit's own
    and the data quoted as it is (`english_on_page`). The other browser tests read English."""
    width, height = VIEWPORTS[0]
    with Tab(chromium, app_url, width, height, locale="zh-CN") as tab:
        tab.open("/")
        first = PAGE_TABLE[0].slug
        assert tab.page.url.endswith(f"/{first}"), f"the root opens the first page, {first}"
        sizes = list(VIEWPORTS)
        for slug in PAGES:
            tab.click_nav(slug)
            for n, (width, height) in enumerate(sizes):
                if n:
                    tab.page.set_viewport_size({"width": width, "height": height})
                if slug in LIVE_PAGES and slug not in OWN_ENGINE_PAGES:  # the classroom: no Step
                    since = tab.runs()
                    tab.page.locator(".st-key-ctl_step button").click()
                    tab.settle(since)
                elif n:  # the frontend's relayout at the new size
                    tab.settle()
                if not n:
                    assert english_on_page(tab.page) == [], f"{slug}: English on the zh page"
                assert tab.exceptions() == 0, f"{slug}: an exception box at {width}x{height}"
                assert tab.page.locator("h1").count() >= 1, f"{slug}: no heading"
                assert tab.errors == [], (f"{slug} at {width}x{height}", tab.errors)
            sizes.reverse()  # the next page starts at the size this one ends at


def test_a_demo_link_sets_the_switches_and_renders(chromium, app_url):
    with Tab(chromium, app_url, 1920, 1080) as tab:
        tab.open("/paging?batching=static&kv_layout=contiguous&spec=off")
        checked = tab.page.locator('[data-testid="stSidebar"] label:has(input:checked)')
        labels = " ".join(checked.all_inner_texts())
        assert "static (tour bus)" in labels and "contiguous (banquet hall)" in labels
        for _ in range(4):
            tab.press("Step")
        assert tab.page.locator(".sl-b.reserved").count() > 0
        assert tab.exceptions() == 0 and tab.errors == [], tab.errors


def test_step_and_play_work_by_clicking(chromium, app_url):
    with Tab(chromium, app_url, 1920, 1080) as tab:
        tab.open("/batching")
        tab.press("Reset")
        assert tab.step_number() == 0
        tab.press("Step")
        assert tab.step_number() == 1
        seats_before = tab.page.locator(".sl-car").first.inner_text()
        tab.press("Step")
        assert tab.step_number() == 2
        assert tab.page.locator(".sl-car").first.inner_text() != seats_before, "seats changed"
        tab.play_until(5)
        paused_at = tab.step_number()
        assert paused_at >= 5
        # a clock still running would step once each Play interval: wait several
        time.sleep(PAUSED_INTERVALS * PLAY_INTERVAL_S)
        assert tab.step_number() == paused_at, "Pause stops the clock"
        assert tab.exceptions() == 0 and tab.errors == [], tab.errors


@pytest.mark.screenshots
def test_screenshots_of_the_main_pages(chromium, app_url):
    """The README's pictures: each live page some way into the same run, at 1920x1080."""
    with Tab(chromium, app_url, 1920, 1080) as tab:
        tab.open("/batching?batching=continuous&kv_layout=paged&spec=off")
        tab.press("Reset")
        tab.play_until(22)
        tab.screenshot("batching")
        for slug in ("paging", "speculation", "dashboard", "home"):
            tab.click_nav(slug)
            tab.screenshot(slug)
        tab.page.locator(".st-key-race_start button").click()
        tab.page.wait_for_selector('[data-testid="stMetric"]:has-text("Ratio")',
                                   timeout=600_000)
        tab.settle()
        tab.page.get_by_text("Live race").first.scroll_into_view_if_needed()
        tab.page.screenshot(path=str(SHOTS / "home-race.png"))  # (SHOTS made by screenshot())
        tab.click_nav("speculation")
        tab.page.locator(".st-key-fwd_measure button").click()
        tab.settle()
        tab.page.locator(".st-key-lossless_run button").click()
        tab.page.wait_for_selector("text=Total variation distance", timeout=600_000)
        tab.settle()
        tab.page.get_by_text("What verifying k tokens costs").first.scroll_into_view_if_needed()
        tab.page.screenshot(path=str(SHOTS / "speculation-measured.png"))
        tab.click_nav("batching")
        tab.page.locator('[data-testid="stSidebar"] label:has-text("中文")').first.click()
        tab.page.wait_for_selector('.st-key-ctl_step button:has-text("单步")')
        tab.settle()
        tab.screenshot("batching-zh")
        assert tab.exceptions() == 0 and tab.errors == [], tab.errors


def predict_and_reveal(tab: Tab, suffix: str, measured: str) -> None:
    """From the class plan, set up the "draft" stop, lock a prediction, play to the reveal."""
    tab.click_nav("plan")
    tab.screenshot(f"plan{suffix}")
    tab.page.locator(".st-key-plan_draft button").click()
    tab.page.wait_for_url(re.compile(r"/speculation(\?.*)?$"))
    tab.settle()
    tab.page.locator(".st-key-pred_draft_choice label").nth(1).click()
    tab.page.locator(".st-key-pred_draft_lock button").click()
    tab.settle()
    tab.screenshot(f"predict-before{suffix}")
    tab.page.locator(".st-key-ctl_play button").click()
    tab.page.wait_for_selector(f"text={measured}", timeout=600_000)
    tab.settle()
    tab.screenshot(f"predict-after{suffix}")
    tab.click_nav("summary")
    tab.screenshot(f"summary{suffix}")


@pytest.mark.screenshots
def test_screenshots_of_the_class_plan_a_prediction_and_the_summary(chromium, app_url):
    """The class in both languages: the plan, a prediction locked before Play and revealed
    after it, and the summary that lists it."""
    with Tab(chromium, app_url, 1920, 1080) as tab:
        tab.open("/plan")
        predict_and_reveal(tab, "", "Measured:")
        assert tab.page.get_by_text("This class predicted").count() >= 1
        tab.page.locator('[data-testid="stSidebar"] label:has-text("中文")').first.click()
        tab.page.wait_for_selector('.st-key-ctl_step button:has-text("单步")')
        tab.settle()
        predict_and_reveal(tab, "-zh", "实测：")
        assert tab.exceptions() == 0 and tab.errors == [], tab.errors
