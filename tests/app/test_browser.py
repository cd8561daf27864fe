"""The app in a real browser: `streamlit run app/main.py` driven by Debian's chromium (playwright).

Every page renders with no exception box and no console error at 1920x1080 and 1280x800; Step
and Play work by clicking; screenshots of the main pages go to build/screenshots/ (gitignored,
so `make test` leaves the work tree clean; `make screenshots` copies them to
assets/screenshots/, which the README shows). Install the browser with
`apt-get install chromium fonts-noto-cjk` (`playwright install` cannot download browsers here).
"""

from __future__ import annotations

import os
import pathlib
import re
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from app.pagelist import LIVE_PAGES, OWN_ENGINE_PAGES, PAGE_TABLE, PAGES  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
SHOTS = pathlib.Path(os.environ.get("SERVELAB_SCREENSHOTS", ROOT / "build" / "screenshots"))
VIEWPORTS = ((1920, 1080), (1280, 800))
# Loading a deep URL (/paging), Streamlit's frontend first looks for its server under that path
# (/paging/_stcore/health, /paging/_stcore/host-config), gets 404 and falls back to the root:
# the framework's base-path discovery, not an app error.
BASE_PATH_PROBE = re.compile(r"/[a-z-]+/_stcore/(health|host-config)$")
TIMEOUT_MS = 180_000
# the sidebar's language choice: every page draws it (after the model, on the live pages)
SIDEBAR_READY = ".st-key-lang"
BUSY_JS = """() => !!document.querySelector('[data-testid="stSpinner"]')
  || document.querySelector('[data-testid="stApp"]')?.getAttribute('data-test-script-state')
     === 'running'"""

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is missing: apt-get install -y chromium fonts-noto-cjk")
    pytest.importorskip("playwright.sync_api", reason="pip install playwright")
    from app.streamlit_run import streamlit_server

    log = tmp_path_factory.mktemp("streamlit") / "server.log"
    with streamlit_server("app/main.py", log_path=log) as (url, _proc):
        yield url


@pytest.fixture(scope="module")
def browser(server):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-background-networking", "--disable-gpu"])
        yield b
        b.close()


class Tab:
    """One browser tab with its console errors collected; `with Tab(...) as tab:` closes it."""

    def __init__(self, browser, server: str, width: int, height: int):
        self.server = server
        self.context = browser.new_context(viewport={"width": width, "height": height},
                                           locale="en-US")
        self.page = self.context.new_page()
        self.page.set_default_timeout(TIMEOUT_MS)
        self.errors: list[str] = []
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))

    def _console(self, msg) -> None:
        if msg.type != "error":
            return
        url = (msg.location or {}).get("url", "")
        if BASE_PATH_PROBE.search(url):
            return
        self.errors.append(f"{msg.text} ({url})")

    def open(self, path: str) -> None:
        self.page.goto(self.server + path)
        self.settle()

    def settle(self) -> None:
        """Wait until the sidebar is there and the script run is over (no spinner, and the
        app has not said "running" for a second)."""
        self.page.wait_for_selector(SIDEBAR_READY)
        quiet_since = None
        deadline = time.time() + TIMEOUT_MS / 1000
        while time.time() < deadline:
            busy = self.page.evaluate(BUSY_JS)
            now = time.time()
            if busy:
                quiet_since = None
            elif quiet_since is None:
                quiet_since = now
            elif now - quiet_since >= 1.0:
                return
            time.sleep(0.25)
        raise AssertionError("the app kept running")

    def click_nav(self, slug: str) -> None:
        self.page.locator(f'[data-testid="stSidebarNav"] a[href$="/{slug}"]').first.click()
        self.page.wait_for_url(re.compile(rf"/{slug}(\?.*)?$"))
        self.settle()

    def sidebar_button(self, label: str):
        return self.page.locator(f'[data-testid="stSidebar"] button:has-text("{label}")').first

    def press(self, label: str) -> None:
        """Click the sidebar button `label` and wait for the script run it starts to end."""
        self.sidebar_button(label).click()
        self.settle()

    def step_number(self) -> int:
        text = self.page.locator("h3", has_text=re.compile(r"^Step \d+$")).first.inner_text()
        return int(text.split()[-1])

    def play_until(self, step: int) -> None:
        self.sidebar_button("Play").click()
        self.page.wait_for_function(
            "n => [...document.querySelectorAll('h3')].some(h => /^Step \\d+$/.test(h.innerText)"
            " && +h.innerText.split(' ')[1] >= n)", arg=step, timeout=TIMEOUT_MS)
        self.press("Pause")

    def screenshot(self, name: str, top: bool = True) -> None:
        """Save <SHOTS>/<name>.png with the sidebar and the page scrolled to the top (`top`),
        or as the app left them (`top=False`: what a projector shows now)."""
        if top:
            for testid in ("stSidebarContent", "stMain"):
                self.page.locator(f'[data-testid="{testid}"]').first.evaluate(
                    "e => e.scrollTo(0, 0)")
        time.sleep(0.5)
        SHOTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(SHOTS / f"{name}.png"))

    def exceptions(self) -> int:
        return self.page.locator('[data-testid="stException"]').count()

    def __enter__(self) -> Tab:
        return self

    def __exit__(self, *exc) -> None:
        self.context.close()


@pytest.mark.parametrize("width,height", VIEWPORTS)
def test_every_page_renders_without_errors(browser, server, width, height):
    with Tab(browser, server, width, height) as tab:
        tab.open("/")
        first = PAGE_TABLE[0].slug
        assert tab.page.url.endswith(f"/{first}"), f"the root opens the first page, {first}"
        for slug in PAGES:
            tab.click_nav(slug)
            if slug in LIVE_PAGES and slug not in OWN_ENGINE_PAGES:  # the classroom has no Step
                tab.press("Step")
            assert tab.exceptions() == 0, f"{slug}: an exception box at {width}x{height}"
            assert tab.page.locator("h1").count() >= 1, f"{slug}: no heading"
        assert tab.errors == [], tab.errors


def test_a_demo_link_sets_the_switches_and_renders(browser, server):
    with Tab(browser, server, 1920, 1080) as tab:
        tab.open("/paging?batching=static&kv_layout=contiguous&spec=off")
        checked = tab.page.locator('[data-testid="stSidebar"] label:has(input:checked)')
        labels = " ".join(checked.all_inner_texts())
        assert "static (tour bus)" in labels and "contiguous (banquet hall)" in labels
        for _ in range(4):
            tab.press("Step")
        assert tab.page.locator(".sl-b.reserved").count() > 0
        assert tab.exceptions() == 0 and tab.errors == [], tab.errors


def test_step_and_play_work_by_clicking(browser, server):
    with Tab(browser, server, 1920, 1080) as tab:
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
        time.sleep(3)
        assert tab.step_number() == paused_at, "Pause stops the clock"
        assert tab.exceptions() == 0 and tab.errors == [], tab.errors


@pytest.mark.screenshots
def test_screenshots_of_the_main_pages(browser, server):
    """The README's pictures: each live page some way into the same run, at 1920x1080."""
    with Tab(browser, server, 1920, 1080) as tab:
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
def test_screenshots_of_the_class_plan_a_prediction_and_the_summary(browser, server):
    """The class in both languages: the plan, a prediction locked before Play and revealed
    after it, and the summary that lists it."""
    with Tab(browser, server, 1920, 1080) as tab:
        tab.open("/plan")
        predict_and_reveal(tab, "", "Measured:")
        assert tab.page.get_by_text("This class predicted").count() >= 1
        tab.page.locator('[data-testid="stSidebar"] label:has-text("中文")').first.click()
        tab.page.wait_for_selector('.st-key-ctl_step button:has-text("单步")')
        tab.settle()
        predict_and_reveal(tab, "-zh", "实测：")
        assert tab.exceptions() == 0 and tab.errors == [], tab.errors
