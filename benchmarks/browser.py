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
BUSY_JS = """() => !!document.querySelector('[data-testid="stSpinner"]')
  || document.querySelector('[data-testid="stApp"]')?.getAttribute('data-test-script-state')
     === 'running'"""


def launch(pw):
    """Headless chromium from playwright's sync API `pw`."""
    return pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


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
