"""What the browser tests share: Debian's chromium driven by playwright (`Tab` and the
constants live in benchmarks/browser.py, which the class benches use too).

The fixtures that start things (`chromium` in tests/conftest.py, `app_url` in
tests/app/conftest.py) are session-scoped: one chromium and one `streamlit run app/main.py` for
the whole run. Playwright's sync API keeps an event loop on the main thread while it is open,
and `asyncio.run` refuses to start under it, so tests/conftest.py runs every test marked
`browser` after all the others (the session's browser opens for the last block and closes with
the session).
"""

from __future__ import annotations

import os

from benchmarks.browser import CHROMIUM, CHROMIUM_ARGS, ROOT, SHOTS, Tab, launch  # noqa: F401

MISSING = f"{CHROMIUM} is missing: apt-get install -y chromium fonts-noto-cjk"


def require_chromium() -> None:
    """Skip where chromium is not installed, saying how to install it; fail under CI."""
    from tests.conftest import require

    require(os.path.exists(CHROMIUM), MISSING)
