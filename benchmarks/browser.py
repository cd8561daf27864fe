"""Driving the Streamlit app and the students' page in Debian's chromium (playwright), for the
benches that measure a class and for the browser tests: `Tab`, one tab on the app with its
console errors collected. `playwright install` cannot download a browser here: install Debian's
with `apt-get install -y chromium fonts-noto-cjk`.
"""

from __future__ import annotations

import os
import pathlib
import re
import time

from playwright.sync_api import TimeoutError as PlaywrightTimeout

ROOT = pathlib.Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-background-networking", "--disable-gpu"]
SHOTS = pathlib.Path(os.environ.get("SERVELAB_SCREENSHOTS", ROOT / "build" / "screenshots"))
# Loading a deep URL (/paging), Streamlit's frontend first looks for its server under that path
# (/paging/_stcore/health, /paging/_stcore/host-config), gets 404 and falls back to the root:
# the framework's base-path discovery, not an app error.
BASE_PATH_PROBE = re.compile(r"/[a-z-]+/_stcore/(health|host-config)$")
TIMEOUT_MS = 180_000
# the sidebar's language choice: every page draws it (after the model, on the live pages)
SIDEBAR_READY = ".st-key-lang"
# Installed in every page of a Tab before Streamlit's own scripts: counts the script runs that
# started (stApp's data-test-script-state turning "running", seen by a MutationObserver, so a
# run that starts and ends between two polls still counts) and tells whether the app is busy
# (a run going, or a spinner drawn).
WATCH_JS = """(() => {
  let ended = 0, quietFrom = 0;
  const state = () => document.querySelector('[data-testid="stApp"]')
    ?.getAttribute('data-test-script-state');
  const count = records => {
    for (const r of records) {
      if (r.oldValue === 'running') ended++;
      quietFrom = performance.now();
    }
  };
  const watch = new MutationObserver(count);
  watch.observe(document, {subtree: true, attributes: true, attributeOldValue: true,
                           attributeFilter: ['data-test-script-state']});
  self.__slStarted = () => { count(watch.takeRecords()); return ended + (state() === 'running'); };
  // idle for `ms`: no run and no spinner since the last call of __slHold, state change or
  // busy poll
  self.__slHold = () => { quietFrom = performance.now(); };
  self.__slQuiet = ms => {
    count(watch.takeRecords());
    const now = performance.now();
    if (state() === 'running' || document.querySelector('[data-testid="stSpinner"]')) {
      quietFrom = now;
      return false;
    }
    return now - quietFrom >= ms;
  };
})()"""
# After an action's run has ended, the app must stay idle this long: a run that ends with
# st.rerun starts its next one at once, and the frontend draws the run's last elements
QUIET_MS = 400
# An action that starts no run (a click on the choice already chosen) is settled by a longer
# idle window instead, long enough for a click's rerun request to reach the server and start
NO_RUN_QUIET_MS = 1000
# How long an action's run may take to start; past it, the longer idle window decides (as for
# an action that starts none), which alone already waits out a slow start
RUN_START_MS = 5_000


def launch(pw):
    """Headless chromium from playwright's sync API `pw`."""
    return pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


class Tab:
    """One browser tab with its console errors collected; `with Tab(...) as tab:` closes it."""

    def __init__(self, browser, server: str, width: int, height: int, locale: str = "en-US"):
        self.server = server
        self.context = browser.new_context(viewport={"width": width, "height": height},
                                           locale=locale)
        self.context.add_init_script(WATCH_JS)
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
        self.settle(since=0)  # (a new document: its first run is its run 1)

    def runs(self) -> int:
        """How many script runs this page has started: take it before an action, and hand it
        to settle(since=...) after."""
        return self.page.evaluate("() => self.__slStarted()")

    def settle(self, since: int | None = None) -> None:
        """Wait until the sidebar is there and the app is idle: with `since` (runs() before an
        action), until a run started after it and then the app stayed idle QUIET_MS; without,
        until the app stayed idle NO_RUN_QUIET_MS."""
        self.page.wait_for_selector(SIDEBAR_READY)
        quiet = NO_RUN_QUIET_MS
        if since is not None:
            try:
                self.page.wait_for_function("n => self.__slStarted() > n", arg=since,
                                            timeout=RUN_START_MS, polling=50)
                quiet = QUIET_MS
            except PlaywrightTimeout:
                pass  # no run seen: the longer idle window decides
        self.page.evaluate("() => self.__slHold()")
        try:
            self.page.wait_for_function("ms => self.__slQuiet(ms)", arg=quiet,
                                        timeout=TIMEOUT_MS, polling=50)
        except PlaywrightTimeout:
            raise AssertionError("the app kept running") from None

    def click_nav(self, slug: str) -> None:
        since = self.runs()
        self.page.locator(f'[data-testid="stSidebarNav"] a[href$="/{slug}"]').first.click()
        self.page.wait_for_url(re.compile(rf"/{slug}(\?.*)?$"))
        self.settle(since)

    def sidebar_button(self, label: str):
        return self.page.locator(f'[data-testid="stSidebar"] button:has-text("{label}")').first

    def press(self, label: str) -> None:
        """Click the sidebar button `label` and wait for the script run it starts to end."""
        since = self.runs()
        self.sidebar_button(label).click()
        self.settle(since)

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
            time.sleep(0.5)  # the scroll's repaint
        SHOTS.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(SHOTS / f"{name}.png"))

    def exceptions(self) -> int:
        return self.page.locator('[data-testid="stException"]').count()

    def __enter__(self) -> Tab:
        return self

    def __exit__(self, *exc) -> None:
        self.context.close()
