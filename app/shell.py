"""The shell every live page shares: the model loaded once per server, the sidebar and the
device line. `app/main.py` builds the navigation (app/nav.py), draws `shell()` and runs the
selected page.
"""

from __future__ import annotations

import streamlit as st

from app.components.gauges import METRIC_CSS
from app.i18n import language_selector, t
from app.live import ensure_model, get_session
from app.replay import is_recording, recording_controls, recording_shell
from app.sidebar import device_line, draw_sidebar


def shell() -> None:
    session = get_session()
    if is_recording(session):  # a replay: no model, no engine (app/replay.py)
        recording_shell(session)
        return
    ensure_model(session.settings.model)
    draw_sidebar(session)
    st.sidebar.html(METRIC_CSS)  # style only: applies to the whole page
    recording_controls()
    try:
        device_line(session.primary.engine.describe())
    except ValueError as exc:  # a KV budget too small for one request, for example
        st.sidebar.error(t("live.build_error", msg=str(exc)))


def own_engine_shell() -> None:
    """The sidebar of a page that runs its own engine (the classroom): the language, and a
    line saying where the single-user controls went. No model loads for the session."""
    language_selector()
    st.sidebar.caption(t("shell.own_engine"))
