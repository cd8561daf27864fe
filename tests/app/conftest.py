"""The app's browser tests share one `streamlit run app/main.py` for the whole run (a cold start
of the app is several seconds of a 2-core machine; each test opens its own tab and session)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def app_url(tmp_path_factory):
    """The URL of the app, served by a child `streamlit run` on a free 127.0.0.1 port."""
    from app.streamlit_run import streamlit_server
    from tests.browsing import require_chromium

    require_chromium()  # nothing to start for a run that cannot open a page
    log = tmp_path_factory.mktemp("streamlit") / "server.log"
    with streamlit_server("app/main.py", log_path=log) as (url, _proc):
        yield url
